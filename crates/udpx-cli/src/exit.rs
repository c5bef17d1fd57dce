//! Exit codes.

/// A flag out of range or a malformed command line.
pub const USAGE: u8 = 2;
/// A feature this machine lacks.
pub const SKIPPED: u8 = 4;
