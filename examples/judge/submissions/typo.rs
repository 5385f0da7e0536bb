// A compile error: a missing semicolon.
fn main() {
    let total = 0
    println!("{total}");
}
