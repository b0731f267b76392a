//! The measuring worker as a stand-alone program (the `anyshape` CLI embeds the same
//! worker as `anyshape __worker`).
fn main() {
    std::process::exit(anyshape_measure::worker::serve());
}
