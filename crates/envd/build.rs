//! Links the `oka-envd` binary as a non-PIE executable on Linux.
//!
//! A position-independent executable is relocated by the dynamic loader at every start: it reads
//! its relocation table (~0.4 MB here) and writes a pointer into every page of `.data.rel.ro`
//! (~0.3 MB: vtables and the addresses in constant tables), which makes those pages private to
//! each process. A daemon that idles in every sandbox should not pay ~0.7 MB of resident memory for
//! that; linked at a fixed address it needs no relocations, and its read-only data stays clean
//! pages of the file that only the ones it touches are resident. The code itself stays
//! position-independent (the linker only resolves the addresses), so nothing else of the build
//! changes, and the shared libraries, heap and stack are still placed at random.
//!
//! Only the package's binaries are linked so (`rustc-link-arg-bins`): its tests, benches and the
//! other crates of the workspace are not affected.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    // A `+crt-static` build chooses its own kind of executable (static-pie unless
    // `-C relocation-model=static`); leave it alone.
    let crt_static = std::env::var("CARGO_CFG_TARGET_FEATURE")
        .is_ok_and(|f| f.split(',').any(|f| f == "crt-static"));
    if os == "linux" && !crt_static {
        println!("cargo::rustc-link-arg-bins=-no-pie");
    }
}
