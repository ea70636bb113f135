//! The `ebb` command.
fn main() {}
