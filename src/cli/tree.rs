//! A run tree as `runs show ID --tree` prints it: the run, its sub-agent
//! runs under it (a pipeline's phases under the pipeline's id), one line
//! each — id, agent, status with its kill reason or error kind, tokens,
//! wall time — or, with `--json`, the same as nested objects.
//!
//! It knows nothing of where the runs come from (the database, or a
//! server): the caller gathers them as [`Node`]s.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use agentvisor::RunId;

/// One run of a tree.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Node {
    pub(super) run_id: RunId,
    pub(super) parent_run_id: Option<RunId>,
    pub(super) agent: String,
    /// `ok`, `killed`, … (or `running`, from a server).
    pub(super) status: String,
    pub(super) kill_reason: Option<String>,
    pub(super) error_kind: Option<String>,
    pub(super) tokens: u64,
    pub(super) cost_micros: u64,
    pub(super) started_at: u64,
    pub(super) duration_ms: u64,
}

/// A node with its children, for `--json`.
#[derive(Serialize)]
struct Nested<'a> {
    #[serde(flatten)]
    node: &'a Node,
    children: Vec<Nested<'a>>,
}

/// The tree under `id` among `nodes` (runs of one tree, in any order):
/// `id` and its descendants; when `id` is no run of its own (a pipeline),
/// every run of the tree, those without a parent among them at the top.
/// Children go in the order they started.
pub(super) struct Tree {
    id: RunId,
    tops: Vec<usize>,
    children: BTreeMap<usize, Vec<usize>>,
    nodes: Vec<Node>,
}

impl Tree {
    pub(super) fn new(id: RunId, mut nodes: Vec<Node>) -> Tree {
        nodes.sort_by_key(|n| (n.started_at, n.run_id));
        let index: BTreeMap<RunId, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.run_id, i))
            .collect();
        let mut children: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut tops = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            match n.parent_run_id.and_then(|p| index.get(&p)) {
                Some(&p) if n.run_id != id => children.entry(p).or_default().push(i),
                _ => tops.push(i),
            }
        }
        if let Some(&me) = index.get(&id) {
            // Only `id`'s own subtree (it may be a run inside a tree).
            tops = vec![me];
        }
        let mut tree = Tree {
            id,
            tops,
            children,
            nodes,
        };
        tree.keep_reachable();
        tree
    }

    /// Drops what hangs under none of the tops (the rest of a tree `id`
    /// is inside of).
    fn keep_reachable(&mut self) {
        let mut seen = HashSet::new();
        let mut stack = self.tops.clone();
        while let Some(i) = stack.pop() {
            if seen.insert(i) {
                stack.extend(self.children.get(&i).into_iter().flatten().copied());
            }
        }
        self.children.retain(|p, _| seen.contains(p));
    }

    /// Whether no run of the tree is known.
    pub(super) fn is_empty(&self) -> bool {
        self.tops.is_empty()
    }

    fn walk(&self, i: usize, depth: usize, out: &mut Vec<(usize, usize, bool)>, last: bool) {
        out.push((i, depth, last));
        let kids = self.children.get(&i).map(Vec::as_slice).unwrap_or_default();
        for (k, &c) in kids.iter().enumerate() {
            self.walk(c, depth + 1, out, k + 1 == kids.len());
        }
    }

    fn nested(&self, i: usize) -> Nested<'_> {
        Nested {
            node: &self.nodes[i],
            children: self
                .children
                .get(&i)
                .into_iter()
                .flatten()
                .map(|&c| self.nested(c))
                .collect(),
        }
    }

    /// `{"root_run_id": ID, "runs": [{…, "children": […]}, …]}`.
    pub(super) fn json(&self) -> String {
        let runs: Vec<Nested<'_>> = self.tops.iter().map(|&i| self.nested(i)).collect();
        serde_json::json!({ "root_run_id": self.id, "runs": runs }).to_string()
    }

    /// The lines to print: a heading, then one line per run, indented
    /// under its parent.
    pub(super) fn lines(&self) -> Vec<String> {
        let mut order = Vec::new();
        for (k, &t) in self.tops.iter().enumerate() {
            self.walk(t, 0, &mut order, k + 1 == self.tops.len());
        }
        let tokens: u64 = order.iter().map(|&(i, _, _)| self.nodes[i].tokens).sum();
        let mut out = vec![format!(
            "tree {}: {} run{}, {tokens} tokens",
            self.id,
            order.len(),
            if order.len() == 1 { "" } else { "s" }
        )];
        // Each line's prefix: the guides of its ancestors, then its own
        // (padding counts characters, so the guides line up).
        let mut open: Vec<bool> = Vec::new();
        let width = order
            .iter()
            .map(|&(i, d, _)| d * 3 + self.nodes[i].run_id.to_string().len())
            .max()
            .unwrap_or(32);
        let agent_width = order
            .iter()
            .map(|&(i, _, _)| self.nodes[i].agent.len())
            .max()
            .unwrap_or(5)
            .max(5);
        for &(i, depth, last) in &order {
            open.truncate(depth);
            let mut prefix = String::new();
            if depth > 0 {
                for &more in &open[1..] {
                    prefix.push_str(if more { "│  " } else { "   " });
                }
                prefix.push_str(if last { "└─ " } else { "├─ " });
            }
            open.push(!last);
            let n = &self.nodes[i];
            let reason = n.kill_reason.as_ref().or(n.error_kind.as_ref());
            let status = match reason {
                Some(r) => format!("{} ({r})", n.status),
                None => n.status.clone(),
            };
            let id = format!("{prefix}{}", n.run_id);
            out.push(format!(
                "{id:<width$}  {:<agent_width$}  {status:<24}  {:>8} tokens  {:>8} ms",
                n.agent, n.tokens, n.duration_ms,
            ));
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node(id: u128, parent: Option<u128>, agent: &str, started_at: u64) -> Node {
        Node {
            run_id: RunId(id),
            parent_run_id: parent.map(RunId),
            agent: agent.into(),
            status: "killed".into(),
            kill_reason: Some("parent".into()),
            error_kind: Some("parent".into()),
            tokens: 10,
            cost_micros: 0,
            started_at,
            duration_ms: 5,
        }
    }

    #[test]
    fn a_tree_prints_children_under_their_parent_in_start_order() {
        let nodes = vec![
            node(3, Some(1), "beta", 3),
            node(1, None, "lead", 1),
            node(4, Some(2), "deep", 4),
            node(2, Some(1), "alpha", 2),
        ];
        let t = Tree::new(RunId(1), nodes.clone());
        let lines = t.lines();
        assert_eq!(lines[0], format!("tree {}: 4 runs, 40 tokens", RunId(1)));
        for (line, agent) in lines[1..].iter().zip(["lead", "alpha", "deep", "beta"]) {
            assert!(line.contains(&format!("  {agent} ")), "{lines:#?}");
        }
        assert!(lines[2].starts_with("├─ "), "{lines:#?}");
        assert!(lines[3].starts_with("│  └─ "), "{lines:#?}");
        assert!(lines[4].starts_with("└─ "), "{lines:#?}");
        assert!(lines[4].contains("killed (parent)"));
        // A run inside the tree: its own subtree only.
        let sub = Tree::new(RunId(2), nodes);
        assert_eq!(sub.lines().len(), 3);
        let json: serde_json::Value = serde_json::from_str(&sub.json()).unwrap();
        assert_eq!(json["runs"][0]["agent"], "alpha");
        assert_eq!(json["runs"][0]["children"][0]["agent"], "deep");
    }

    #[test]
    fn a_pipeline_has_its_phases_at_the_top() {
        let t = Tree::new(
            RunId(9),
            vec![node(5, None, "p.one", 1), node(6, None, "p.two", 2)],
        );
        let lines = t.lines();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].contains("p.one") && lines[2].contains("p.two"));
        assert!(Tree::new(RunId(9), Vec::new()).is_empty());
    }
}
