//! The measuring worker, for this crate's tests (the CLI embeds it as `anyshape __worker`).
fn main() {
    std::process::exit(anyshape_measure::worker::serve());
}
