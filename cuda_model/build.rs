//! The model answers to the driver's SONAME, as the real libcuda does.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
