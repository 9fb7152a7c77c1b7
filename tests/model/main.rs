//! podlock's protocol model, checked: see `tests/model/src/lib.rs` and docs/design.md, "The
//! protocol model".

fn main() -> std::process::ExitCode {
    podlock_model::run()
}
