//! `cargo bench`: the cached malloc+free pair through the C ABI against the C library's malloc+free,
//! as `accalloc bench` reports it. Figures are ratios within one run, not absolute promises.

fn main() {
    // `cargo bench -- --quick` for a short run.
    let quick = std::env::args().any(|a| a == "--quick");
    let (batches, pairs) = if quick { (11, 2_000) } else { (101, 20_000) };
    let rows = accalloc_tools::replay::bench::run(batches, pairs);
    println!("median of {batches} batches of {pairs} malloc+free pairs, host backend, one thread");
    print!("{}", accalloc_tools::replay::bench::table(&rows));
}
