//! The conformance macros: one `#[test]` per check of a suite, for a backend
//! ([`backend_conformance!`](crate::backend_conformance)) or a namespace
//! ([`namespace_conformance!`](crate::namespace_conformance)).
//!
//! Each macro holds its suite's list of checks (the suite's `CHECK_NAMES` is made from it), so
//! a check added to a suite becomes a test of every backend that uses the macro. A test passes
//! when its check passes, or, for a check listed under `skipped`, when the check says it does
//! not apply (the reason goes to stderr), or, for one listed under `failing`, when it fails; a
//! listed check that passes fails its test, so the lists stay true.

/// One `#[test]` per check of the backend conformance suite ([`crate::conformance`]), in a
/// module of its own:
///
/// ```no_run
/// ebb_backend::backend_conformance! {
///     /// The memory backend (one-phase: the two-phase check does not apply).
///     mod mem {
///         backend: ebb_backend::MemBackend::new(),
///         skipped: [two_phase_commit_and_restart],
///     }
/// }
/// ```
///
/// `backend` is an expression evaluated once per check, giving a fresh backend. An optional
/// `setup: { ... }` block runs first in each test: its `let`s are in scope in `backend`, and
/// `?` on an `Option` in it ends the test early (a missing server: the setup prints SKIPPED,
/// and fails under `CI`, as the house rule says). `skipped: [...]` lists the checks that do not
/// apply to this backend; `failing: [...]` the checks it is known to fail today (the test then
/// passes while the check fails, and fails once it passes, so the list shrinks with the fixes).
/// An optional `after: { ... }` block runs after the check, with the setup's names in scope.
/// The names of the enclosing module are in scope (`use super::*`).
#[macro_export]
macro_rules! backend_conformance {
    (@names) => {
        $crate::backend_conformance!(@checks names)
    };
    (@dispatch $($input:tt)*) => {
        $crate::backend_conformance!(@checks dispatch $($input)*)
    };
    (@checks $($input:tt)*) => {
        $crate::__conformance_module! {
            [
                namespace
                write_read_pages
                read_past_eof_is_short
                overwrite
                sparse_hole_reads_zeros
                set_size_smaller_and_larger
                reopen_and_truncate
                sync_after_write
                zero_length_requests
                alignment_rule
                unaligned_user_buffer
                large_run
                two_phase_commit_and_restart
                concurrent_writers
            ]
            $crate::conformance::assert_check,
            $($input)*
        }
    };
    ($($input:tt)*) => {
        $crate::backend_conformance!(@checks $($input)*);
    };
}

/// One `#[test]` per check of the namespace conformance suite
/// ([`crate::namespace_conformance`]), in a module of its own; the same form as
/// [`backend_conformance!`](crate::backend_conformance), with `namespace:` (one namespace per
/// check) instead of `backend:`:
///
/// ```no_run
/// ebb_backend::namespace_conformance! {
///     mod dir {
///         setup: { let root = tempfile::tempdir().ok()?; },
///         namespace: ebb_backend::DirNamespace::open(root.path()).expect("open"),
///     }
/// }
/// ```
#[macro_export]
macro_rules! namespace_conformance {
    (@names) => {
        $crate::namespace_conformance!(@checks names)
    };
    (@dispatch $($input:tt)*) => {
        $crate::namespace_conformance!(@checks dispatch $($input)*)
    };
    (@checks $($input:tt)*) => {
        $crate::__conformance_module! {
            [
                lookup_missing
                create_lookup_getattr
                mkdir_readdir
                remove
                rename
                setattr
                hard_link
                symlink
                file_data
            ]
            $crate::namespace_conformance::assert_check,
            $($input)*
        }
    };
    ($($input:tt)*) => {
        $crate::namespace_conformance!(@checks $($input)*);
    };
}

/// The module of tests both macros generate (and their list of check names).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_module {
    ([$($check:ident)*] $runner:path, names) => {
        &[$(stringify!($check)),*]
    };
    ([$($check:ident)*] $runner:path, dispatch $name:expr, $generic:ty, $function:ty) => {
        match $name {
            $(stringify!($check) => Some($check::<$generic> as $function),)*
            _ => None,
        }
    };
    (
        [$($check:ident)*] $runner:path,
        $(#[$meta:meta])*
        mod $module:ident {
            $(setup: { $($setup:tt)* },)?
            $(backend)? $(namespace)?: $make:expr
            $(, skipped: [$($skipped:ident),* $(,)?])?
            $(, failing: [$($failing:ident),* $(,)?])?
            $(, after: { $($after:tt)* })?
            $(,)?
        }
    ) => {
        $(#[$meta])*
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            /// Runs one check: the setup, the check, then the `after` block.
            fn run(check: &'static str) -> ::std::option::Option<()> {
                $($($setup)*)?
                let skipped: &[&str] = &[$($(stringify!($skipped)),*)?];
                let failing: &[&str] = &[$($(stringify!($failing)),*)?];
                $runner(check, $crate::conformance::Expected { skipped, failing }, &|| $make);
                $($($after)*)?
                ::std::option::Option::Some(())
            }

            $(
                #[test]
                fn $check() {
                    let _ = run(stringify!($check));
                }
            )*
        }
    };
}
