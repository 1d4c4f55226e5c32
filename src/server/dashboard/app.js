// The agentvisor dashboard: plain JavaScript against the public API.
// Runs table: GET /v1/runs, then the host-wide feed GET /v1/events (SSE).
// Ended runs listed before the page opened get their tokens, cost and
// last critic decision from GET /v1/runs/{id}, a few at a time.
// Schedules panel (serve --skills): GET /v1/schedules every 5 s, and
// its buttons POST /v1/schedules/{name}/run|pause|resume.
// Run page: GET /v1/runs/{id}, its events (SSE), its tree
// (GET /v1/runs?root=id), and the buttons' POSTs. A kill asks first.
"use strict";

const $ = (id) => document.getElementById(id);
const zeros = () => new Array(120).fill(0);
const state = {
  token: new URLSearchParams(location.search).get("token") || localStorage.getItem("agentvisor.token") || "",
  runs: new Map(),       // run_id -> row data
  feed: null,            // EventSource of /v1/events
  runStream: null,       // EventSource of the open run
  ended: [],             // [t_ms, duration_ms, tokens] of recently ended runs
  // Two minutes of one-second samples per chart, oldest first.
  series: { rps: zeros(), active: zeros(), p50: zeros(), p99: zeros(), tps: zeros() },
};

function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

function withToken(url) {
  if (!state.token) return url;
  return url + (url.includes("?") ? "&" : "?") + "access_token=" + encodeURIComponent(state.token);
}

async function api(method, path, body) {
  const opts = { method, headers: authHeaders(body ? { "Content-Type": "application/json" } : {}) };
  if (body) opts.body = JSON.stringify(body);
  const resp = await fetch(path, opts);
  const data = await resp.json().catch(() => ({}));
  if (resp.status === 401) { askToken(); }
  return { status: resp.status, data };
}

function askToken() {
  $("login").hidden = false;
  setConn("token needed", false);
}

function setConn(text, live) {
  $("conn").textContent = text;
  $("conn").className = live ? "pill live" : "pill";
}

// ---- the runs table -------------------------------------------------------

function age(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  return s < 60 ? s + "s" : s < 3600 ? Math.floor(s / 60) + "m" + (s % 60) + "s" : Math.floor(s / 3600) + "h";
}

function upsert(run) {
  const old = state.runs.get(run.run_id) || {};
  const row = Object.assign(old, run);
  state.runs.set(run.run_id, row);
  return row;
}

// The last critic decision, as a cell says it: "kill (runaway, loop cycle)".
function decisionText(d) {
  if (!d) return "";
  const why = [d.reason, d.loop ? "loop " + d.loop : null].filter(Boolean).join(", ");
  return d.action + (why ? " (" + why + ")" : "");
}

function fromItem(r) {
  return {
    run_id: r.run_id, agent: r.agent, caller_id: r.caller_id, parent_run_id: r.parent_run_id,
    status: r.status, kill_reason: r.kill_reason,
    started_ms: r.live ? Date.now() - r.live.elapsed_ms : (r.finished_at || Date.now()) - r.duration_ms,
    ended_ms: r.finished_at || null,
    step: r.live ? r.live.iteration : (r.step || null),
    tokens: r.live ? r.live.tokens : null,
    cost_micros: r.live ? (r.live.cost_micros || 0) : null,
    decision: r.live && r.live.last_decision ? decisionText(r.live.last_decision) : null,
    waiting: r.live ? (r.live.awaiting_approval || []).length : 0,
    detailed: false,
  };
}

// What an ended run's result adds to its row: tokens, cost, the critic's
// last decision (the one that ended it, for a kill).
function fromResult(result) {
  const u = result.usage || {};
  const last = (result.critic || [])[(result.critic || []).length - 1];
  return {
    tokens: (u.input_tokens || 0) + (u.output_tokens || 0),
    cost_micros: result.cost_micros || 0,
    step: result.iterations,
    decision: last ? decisionText(last) : "–",
    detailed: true,
  };
}

// Ended rows on screen without their result's figures, fetched a few at a
// time (the 50 newest of them at most, each once).
const details = { inFlight: 0, wanted: [] };
async function pumpDetails() {
  while (details.inFlight < 4 && details.wanted.length) {
    const id = details.wanted.shift();
    const row = state.runs.get(id);
    if (!row || row.detailed || row.status === "running" || row.fetching) continue;
    row.fetching = true;
    details.inFlight++;
    api("GET", "/v1/runs/" + id).then(({ status, data }) => {
      if (status === 200 && data.result) Object.assign(row, fromResult(data.result));
    }).finally(() => { row.fetching = false; details.inFlight--; scheduleRender(); pumpDetails(); });
  }
}

function visible(r) {
  const st = $("f-status").value, ag = $("f-agent").value.trim(), ca = $("f-caller").value.trim();
  return (!st || r.status === st) && (!ag || r.agent.includes(ag)) && (!ca || (r.caller_id || "").includes(ca));
}

// Live runs first, then ended ones; newest first within each (run ids
// start with their time).
function byLiveThenNewest(a, b) {
  const live = (b.status === "running") - (a.status === "running");
  if (live) return live;
  return b.run_id > a.run_id ? 1 : b.run_id < a.run_id ? -1 : 0;
}

function render() {
  const rows = [...state.runs.values()].filter(visible).sort(byLiveThenNewest).slice(0, 300);
  details.wanted = rows.filter((r) => r.status !== "running" && !r.detailed).slice(0, 50).map((r) => r.run_id);
  const body = $("runs").tBodies[0];
  const html = rows.map((r) => {
    const a = r.ended_ms ? r.ended_ms - r.started_ms : Date.now() - r.started_ms;
    const status = r.status + (r.kill_reason ? " (" + r.kill_reason + ")" : "") +
      (r.status === "running" && r.waiting ? " · awaiting approval" : "");
    const cost = r.cost_micros != null ? (r.cost_micros / 1e6).toFixed(4) : "";
    const kill = r.status === "running" ? `<button class="danger kill" data-id="${r.run_id}">Kill</button>` : "";
    return `<tr data-id="${r.run_id}"><td class="id"><code>${r.run_id}</code></td>` +
      `<td class="status ${r.status}">${esc(status)}</td><td>${esc(r.agent)}</td><td>${esc(r.caller_id || "-")}</td>` +
      `<td class="num">${age(a)}</td><td class="num">${r.step ?? ""}</td><td class="num tokens">${r.tokens ?? ""}</td>` +
      `<td class="num cost">${cost}</td><td class="decision">${esc(r.decision || (r.status !== "running" && r.detailed ? "–" : ""))}</td><td>${kill}</td></tr>`;
  }).join("");
  body.innerHTML = html;
  $("count").textContent = rows.length + " shown, " + [...state.runs.values()].filter((r) => r.status === "running").length + " running";
}

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

async function loadRuns() {
  const { status, data } = await api("GET", "/v1/runs?limit=200");
  if (status !== 200) return false;
  for (const r of data.runs) upsert(Object.assign(fromItem(r), { preexisting: true }));
  render();
  return true;
}

async function refreshLive() {
  const { status, data } = await api("GET", "/v1/runs?status=running&limit=500");
  if (status !== 200) return;
  for (const r of data.runs) {
    const row = { step: r.live.iteration, tokens: r.live.tokens, cost_micros: r.live.cost_micros || 0, waiting: (r.live.awaiting_approval || []).length, run_id: r.run_id, agent: r.agent, caller_id: r.caller_id, status: "running", started_ms: Date.now() - r.live.elapsed_ms };
    // The critic's latest decision, for runs that began before the page
    // opened (later ones come through the feed).
    if (r.live.last_decision) row.decision = decisionText(r.live.last_decision);
    upsert(row);
  }
}

function connectFeed() {
  if (state.feed) state.feed.close();
  const es = new EventSource(withToken("/v1/events"));
  state.feed = es;
  es.onopen = () => setConn("live", true);
  es.onerror = () => setConn("reconnecting…", false);
  es.onmessage = (m) => {
    const ev = JSON.parse(m.data);
    if (ev.type === "run.started") {
      upsert({ run_id: ev.run_id, agent: ev.agent, caller_id: ev.caller_id, parent_run_id: ev.parent_run_id, status: "running", started_ms: ev.at_ms, ended_ms: null, step: 0, tokens: 0, cost_micros: 0 });
    } else if (ev.type === "run.ended") {
      const row = upsert({ run_id: ev.run_id, agent: ev.agent, caller_id: ev.caller_id, status: ev.status, kill_reason: ev.kill_reason, ended_ms: ev.at_ms, step: ev.iterations, tokens: ev.tokens, cost_micros: ev.cost_micros });
      // Its decisions came through the feed, unless it began before this
      // page did or the feed lost events (it is lossy): then its result
      // says.
      row.detailed = !(row.preexisting || state.lagged);
      if (row.started_ms == null) row.started_ms = ev.at_ms - ev.duration_ms;
      state.ended.push([Date.now(), ev.duration_ms, ev.tokens]);
      if (openRunId() === ev.run_id) refreshRun();
    } else if (ev.type === "lagged") {
      state.lagged = true;
    } else if (ev.type === "critic.decision") {
      upsert({ run_id: ev.run_id, agent: ev.agent, caller_id: ev.caller_id, decision: decisionText(ev.decision) });
    }
    scheduleRender();
  };
}

let renderQueued = false;
function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => { renderQueued = false; if (!$("home").hidden) render(); });
}

// ---- charts ---------------------------------------------------------------

function pct(sorted, p) {
  if (!sorted.length) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

function tick() {
  const now = Date.now();
  state.ended = state.ended.filter((e) => now - e[0] < 10000);
  const last1 = state.ended.filter((e) => now - e[0] < 1000);
  const lat = state.ended.map((e) => e[1]).sort((a, b) => a - b);
  const s = state.series;
  const push = (k, v) => { s[k].push(v); if (s[k].length > 120) s[k].shift(); };
  const active = [...state.runs.values()].filter((r) => r.status === "running").length;
  push("rps", last1.length);
  push("active", active);
  push("p50", pct(lat, 0.5));
  push("p99", pct(lat, 0.99));
  push("tps", last1.reduce((t, e) => t + e[2], 0));
  $("v-rps").textContent = last1.length;
  $("v-active").textContent = active;
  $("v-lat").textContent = lat.length ? pct(lat, 0.5) + " / " + pct(lat, 0.99) : "–";
  $("v-tps").textContent = s.tps[s.tps.length - 1];
  draw("c-rps", [s.rps]);
  draw("c-active", [s.active]);
  draw("c-lat", [s.p50, s.p99]);
  draw("c-tps", [s.tps]);
  if (!$("home").hidden) render();
}

function draw(id, lines) {
  const c = $(id), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const max = Math.max(1, ...lines.flat());
  const colours = ["#0b57d0", "#b3261e"];
  g.fillStyle = "#6b7480";
  g.font = "10px sans-serif";
  g.fillText(String(max), 2, 10);
  g.strokeStyle = "#dde1e6";
  g.beginPath(); g.moveTo(0, c.height - 1.5); g.lineTo(c.width, c.height - 1.5); g.stroke();
  lines.forEach((pts, i) => {
    g.strokeStyle = colours[i % colours.length];
    g.beginPath();
    pts.forEach((v, x) => {
      const px = (x / 119) * (c.width - 2) + 1, py = c.height - 2 - (v / max) * (c.height - 6);
      x ? g.lineTo(px, py) : g.moveTo(px, py);
    });
    g.stroke();
  });
}

// ---- the run page ---------------------------------------------------------

function openRunId() {
  const m = location.hash.match(/^#run\/([0-9a-f]{32})$/);
  return m ? m[1] : null;
}

async function refreshRun() {
  const id = openRunId();
  if (!id) return;
  const { status, data } = await api("GET", "/v1/runs/" + id);
  if (status !== 200) { $("r-status").textContent = (data.error && data.error.message) || "not found"; return; }
  $("r-status").textContent = data.status + (data.kill_reason ? " (" + data.kill_reason + ")" : "");
  $("r-status").className = "status " + data.status;
  const facts = { agent: data.agent, caller: data.caller_id || "-", parent: data.parent_run_id || "-" };
  if (data.live) Object.assign(facts, { step: data.live.iteration + " / " + data.live.max_iterations, tokens: data.live.tokens, elapsed: age(data.live.elapsed_ms) });
  if (data.result) {
    const f = fromResult(data.result);
    Object.assign(facts, { output: data.output || "", tokens: f.tokens, "cost $": (f.cost_micros / 1e6).toFixed(4), "last critic decision": f.decision });
  }
  $("r-facts").innerHTML = Object.entries(facts).map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("");
  const running = data.status === "running";
  for (const b of ["b-steer", "b-extend", "b-kill"]) $(b).disabled = !running;
  // Approve and deny while the run waits for an operator.
  const waiting = running && data.live ? (data.live.awaiting_approval || []) : [];
  $("r-approval").hidden = waiting.length === 0;
  for (const b of ["b-approve", "b-deny"]) $(b).disabled = waiting.length === 0;
  $("r-approvals").innerHTML = waiting.map((p) => `<li><code>${esc(p.call_id)}</code> <b>${esc(p.tool)}</b> <code>${esc(p.arguments.slice(0, 400))}</code></li>`).join("");
  await showFork(id, data.result && data.result.forked_from);
  const tree = await api("GET", "/v1/runs?limit=500&root=" + id);
  if (tree.status === 200) $("r-tree").innerHTML = treeHtml(id, tree.data.runs);
}

// A fork's source (linked) and its diff against it, step by step.
async function showFork(id, from) {
  $("r-fork").hidden = !from;
  if (!from) return;
  $("r-fork-source").innerHTML = `<a href="#run/${esc(from.run_id)}"><code>${esc(from.run_id)}</code></a>, ` +
    `steps 1–${from.step} taken from its recording`;
  if (state.diffed === id) return;   // an ended fork's diff does not change
  const { status, data } = await api("GET", "/v1/diff?a=" + from.run_id + "&b=" + id);
  if (status !== 200) { $("r-diff-summary").textContent = (data.error && data.error.message) || "no diff"; return; }
  if (data.b.status) state.diffed = id;
  const first = data.first_divergence;
  $("r-diff-summary").textContent = first
    ? "first divergence at step " + first.step + " (" + first.what.join(", ") + ")"
    : "no divergence: the fork did what its source did";
  const side = (s) => s ? (s.calls || []).map((c) => c.tool).join(", ") || "text" : "–";
  $("r-diff").innerHTML = "<tr><th>step</th><th>source</th><th>fork</th><th>differs in</th></tr>" +
    data.steps.map((p) => `<tr class="${p.same ? "" : "changed"}" data-step="${p.step}"><td>${p.step}</td>` +
      `<td>${esc(side(p.a))}</td><td>${esc(side(p.b))}</td><td>${esc(p.differences.join(", "))}</td></tr>`).join("") +
    `<tr><td>end</td><td>${esc(data.a.status || "")}</td><td>${esc(data.b.status || "")}</td>` +
    `<td>${esc(data.endings.differences.join(", "))}</td></tr>`;
}

// The run and its sub-agents at any depth, each under its parent.
function treeHtml(id, runs) {
  const kids = new Map();
  for (const r of runs) {
    if (r.run_id === id || !r.parent_run_id) continue;
    if (!kids.has(r.parent_run_id)) kids.set(r.parent_run_id, []);
    kids.get(r.parent_run_id).push(r);
  }
  const self = runs.find((r) => r.run_id === id) || { run_id: id, agent: "", status: "" };
  const node = (r, depth) => {
    const tokens = r.live ? r.live.tokens + " tokens" : "";
    const status = r.status + (r.kill_reason ? " (" + r.kill_reason + ")" : "");
    const below = (kids.get(r.run_id) || []).sort((a, b) => (a.run_id > b.run_id ? 1 : -1));
    const inner = depth < 16 && below.length ? "<ul>" + below.map((k) => node(k, depth + 1)).join("") + "</ul>" : "";
    const here = r.run_id === id ? `<code>${r.run_id}</code>` : `<a href="#run/${r.run_id}"><code>${r.run_id}</code></a>`;
    return `<li data-id="${r.run_id}">${here} ${esc(r.agent)} <span class="status ${esc(r.status)}">${esc(status)}</span> ${tokens}${inner}</li>`;
  };
  return node(self, 0);
}

// Asks before a kill: resolves true when the operator confirms.
function confirmKill(id) {
  const row = state.runs.get(id);
  $("confirm-text").textContent = "Kill run " + id + (row ? " (" + row.agent + ")" : "") +
    "? It ends killed (operator), and so do its sub-agents.";
  const dialog = $("confirm");
  return new Promise((resolve) => {
    const done = (yes) => {
      $("confirm-yes").onclick = null;
      $("confirm-no").onclick = null;
      dialog.oncancel = null;
      if (dialog.open) dialog.close();
      resolve(yes);
    };
    $("confirm-yes").onclick = () => done(true);
    $("confirm-no").onclick = () => done(false);
    dialog.oncancel = () => done(false);   // Escape
    dialog.showModal();
  });
}

function openRun(id) {
  $("home").hidden = true;
  $("run").hidden = false;
  $("r-id").textContent = id;
  $("r-msg").textContent = "";
  $("r-timeline").innerHTML = "";
  if (state.runStream) state.runStream.close();
  const es = new EventSource(withToken("/v1/runs/" + id + "/events"));
  state.runStream = es;
  let deltas = null;
  es.onmessage = (m) => {
    const ev = JSON.parse(m.data);
    if (ev.type === "text.delta") {
      if (!deltas) { deltas = document.createElement("li"); $("r-timeline").appendChild(deltas); }
      deltas.textContent += ev.text;
      return;
    }
    deltas = null;
    const li = document.createElement("li");
    const rest = Object.assign({}, ev);
    delete rest.type; delete rest.run_id; delete rest.seq;
    li.textContent = ev.seq + "  " + ev.type + "  " + JSON.stringify(rest).slice(0, 240);
    if (ev.type.startsWith("critic.")) li.className = "critic";
    if (ev.type.startsWith("approval.")) { li.className = "critic"; refreshRun(); }
    if (ev.type === "run.end") {
      li.className = "end";
      es.close();                    // the stream is over; no reconnect
      refreshRun();
    }
    $("r-timeline").appendChild(li);
  };
  es.onerror = () => { if (es.readyState === EventSource.CLOSED) es.close(); };
  refreshRun();
}

async function command(action, body) {
  const id = openRunId();
  const { status, data } = await api("POST", "/v1/runs/" + id + "/" + action, body);
  $("r-msg").textContent = status === 202 || status === 200 ? action + ": sent" : (data.error ? data.error.message : "HTTP " + status);
  if (action === "approve" || action === "deny") refreshRun();
}

function route() {
  const id = openRunId();
  if (id) { openRun(id); return; }
  if (state.runStream) { state.runStream.close(); state.runStream = null; }
  $("run").hidden = true;
  $("home").hidden = false;
  render();
}

// ---- the schedules panel --------------------------------------------------

async function loadSchedules() {
  const { status, data } = await api("GET", "/v1/schedules");
  // Not an admin token, or no skills repository: no panel.
  if (status !== 200 || !data.repo) { $("schedules").hidden = true; return; }
  $("schedules").hidden = false;
  // The repository's folder name; its whole path on hover.
  $("s-repo").textContent = data.repo.split("/").filter(Boolean).pop() || data.repo;
  $("s-repo").title = data.repo;
  $("s-table").querySelector("tbody").innerHTML = data.schedules.map((s) => {
    const last = s.last_outcome ? s.last_outcome + (s.last_reason ? " (" + s.last_reason + ")" : "") : "–";
    const lastRun = s.last_run_id ? ` <a href="#run/${esc(s.last_run_id)}">run</a>` : "";
    const streak = s.streak ? s.streak + " × " + (s.streak_reason || "") : "0";
    const paused = s.paused ? "paused: " + s.paused_why : "";
    const toggle = s.paused
      ? `<button data-act="resume" data-name="${esc(s.name)}">Resume</button>`
      : `<button data-act="pause" data-name="${esc(s.name)}">Pause</button>`;
    return `<tr><td>${esc(s.name)}${s.running ? " <b class=\"status running\">running</b>" : ""}</td><td>${esc(s.skill)}</td>` +
      `<td><code>${esc(s.cron)}</code> ${esc(s.timezone)}</td><td>${esc(s.next_fire || "never")}</td>` +
      `<td class="status ${esc(s.last_outcome || "")}">${esc(last)}${lastRun}</td><td>${esc(streak)}</td>` +
      `<td class="${s.paused ? "status error" : ""}">${esc(paused)}</td>` +
      `<td class="num">${s.spent_tokens} tok</td>` +
      `<td><button data-act="run" data-name="${esc(s.name)}">Run now</button> ${toggle}</td></tr>`;
  }).join("");
}

$("s-table").addEventListener("click", async (e) => {
  const b = e.target.closest("button[data-act]");
  if (!b) return;
  const { status, data } = await api("POST", "/v1/schedules/" + encodeURIComponent(b.dataset.name) + "/" + b.dataset.act);
  $("s-msg").textContent = status < 300
    ? b.dataset.name + ": " + (data.fired ? data.fired + (data.reason ? " (" + data.reason + ")" : "") : b.dataset.act + "d")
    : (data.error ? data.error.message : "HTTP " + status);
  loadSchedules();
});

// ---- wiring ---------------------------------------------------------------

$("runs").addEventListener("click", async (e) => {
  const kill = e.target.closest("button.kill");
  if (kill) {
    e.stopPropagation();
    if (!(await confirmKill(kill.dataset.id))) return;
    kill.disabled = true;
    await api("POST", "/v1/runs/" + kill.dataset.id + "/kill");
    return;
  }
  const tr = e.target.closest("tr[data-id]");
  if (tr) location.hash = "#run/" + tr.dataset.id;
});
for (const f of ["f-status", "f-agent", "f-caller"]) $(f).addEventListener("input", render);
$("b-steer").addEventListener("click", () => {
  const text = $("r-steer-text").value.trim();
  if (text) command("steer", { text });
});
$("b-extend").addEventListener("click", () => command("extend", { seconds: 60 }));
$("b-approve").addEventListener("click", () => command("approve"));
$("b-deny").addEventListener("click", () => command("deny", { note: $("r-deny-reason").value.trim() }));
$("b-kill").addEventListener("click", async () => {
  if (await confirmKill(openRunId())) command("kill");
});
$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  state.token = $("token").value.trim();
  localStorage.setItem("agentvisor.token", state.token);
  $("login").hidden = true;
  start();
});
window.addEventListener("hashchange", route);

async function start() {
  if (!(await loadRuns())) return;
  loadSchedules();
  connectFeed();
  route();
}

setInterval(tick, 1000);
setInterval(() => { if (state.feed) refreshLive(); }, 2000);
setInterval(pumpDetails, 500);
setInterval(() => { if (state.feed && !$("home").hidden) loadSchedules(); }, 5000);
start();
