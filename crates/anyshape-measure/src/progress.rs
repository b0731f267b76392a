//! Progress of long work, as libraries report it and front ends show it (a progress
//! bar on a terminal, a line per step elsewhere): work items counted against a total,
//! a message about the current item, and notes (warnings, steps) to show as lines.

/// Hears the progress of long work.
pub trait Progress {
    /// Work of `total` items called `what` starts.
    fn start(&mut self, what: &str, total: usize);
    /// `n` more items are done.
    fn inc(&mut self, n: usize);
    /// What is being worked on now.
    fn message(&mut self, text: &str);
    /// A line to show (a step, a warning).
    fn note(&mut self, line: &str);
    /// The work started last is done.
    fn finish(&mut self);
}

/// Progress that goes nowhere (tests, quiet callers).
pub struct Silent;

impl Progress for Silent {
    fn start(&mut self, _: &str, _: usize) {}
    fn inc(&mut self, _: usize) {}
    fn message(&mut self, _: &str) {}
    fn note(&mut self, _: &str) {}
    fn finish(&mut self) {}
}
