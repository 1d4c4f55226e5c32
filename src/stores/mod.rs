//! Store batteries.
