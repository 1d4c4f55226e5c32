//! Model batteries.
