//! The one runner of conformance suites: a suite is a table of named checks, each an async
//! function that gets a fresh subject (a store, a lease backend, a ledger) and panics on a
//! broken expectation; a backend's test supplies only a factory for subjects.
//!
//! The suites (the event store's, the lease backends', the ledger's) keep their check
//! tables with their trait; what they share is how a table runs, and that lives here:
//!
//! ```
//! use agentloop_testkit::conformance::{Check, run_checks};
//!
//! async fn starts_empty(subject: Vec<u32>) {
//!     assert!(subject.is_empty());
//! }
//!
//! const CHECKS: &[Check<Vec<u32>>] = &[("starts_empty", |s| Box::pin(starts_empty(s)))];
//!
//! # futures::executor::block_on(async {
//! // The guard (here `()`; a temp dir, a database) lives until its check and the clean-up
//! // are over.
//! run_checks("example", CHECKS, async || (Vec::new(), ()), async |_| {}).await;
//! # });
//! ```

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;

/// One named check: gets a fresh subject, panics on a broken expectation.
///
/// A plain `fn` pointer (not a closure) so that a suite's checks fit in a `const` table;
/// the future is boxed because each check's future has a type of its own.
pub type Check<S> = (&'static str, fn(S) -> BoxFuture<'static, ()>);

/// Runs every check of `checks` in order, each on a subject of its own from `make`, and
/// fails with the suite's and the check's name.
///
/// `make` returns the subject and a guard (a temp dir, a database to drop, `()`). After
/// each check, passed or failed, `clean_up` gets the subject (for what cannot happen in a
/// `Drop`, such as awaiting a pool's close: `async |_| {}` when there is nothing to do),
/// and then the guard is dropped — so a failed check still leaves nothing behind, and the
/// next check starts on a fresh subject.
///
/// # Panics
///
/// When a check panics: with `{suite} conformance check `{name}` failed: {message}`.
pub async fn run_checks<S, G>(
    suite: &str,
    checks: &[Check<S>],
    mut make: impl AsyncFnMut() -> (S, G),
    mut clean_up: impl AsyncFnMut(S),
) where
    S: Clone,
{
    for (name, check) in checks {
        let (subject, guard) = make().await;
        // The panic is caught only to clean up first and to name the check; the subject is
        // not used again after a panic, so unwind safety is not at stake.
        let result = AssertUnwindSafe(check(subject.clone()))
            .catch_unwind()
            .await;
        clean_up(subject).await;
        drop(guard);
        if let Err(payload) = result {
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            panic!("{suite} conformance check `{name}` failed: {message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::panic::AssertUnwindSafe;
    use std::sync::{Arc, Mutex};

    use super::{Check, run_checks};

    type Journal = Arc<Mutex<Vec<String>>>;

    fn note(journal: &Journal, line: &str) {
        journal.lock().unwrap().push(line.to_owned());
    }

    async fn passes(journal: Journal) {
        note(&journal, "passes ran");
    }

    async fn fails(journal: Journal) {
        note(&journal, "fails ran");
        panic!("the expectation");
    }

    async fn never_reached(journal: Journal) {
        note(&journal, "never_reached ran");
    }

    const CHECKS: &[Check<Journal>] = &[
        ("passes", |j| Box::pin(passes(j))),
        ("fails", |j| Box::pin(fails(j))),
        ("never_reached", |j| Box::pin(never_reached(j))),
    ];

    /// Dropped after the clean-up: records that it was.
    struct Guard(Journal);

    impl Drop for Guard {
        fn drop(&mut self) {
            note(&self.0, "guard dropped");
        }
    }

    #[test]
    fn each_check_gets_a_fresh_subject_and_a_failure_names_it_after_cleaning_up() {
        let journal = Journal::default();
        let made = Arc::new(Mutex::new(0));
        let run = run_checks(
            "example",
            CHECKS,
            async || {
                *made.lock().unwrap() += 1;
                note(&journal, "made");
                (Arc::clone(&journal), Guard(Arc::clone(&journal)))
            },
            async |subject: Journal| note(&subject, "cleaned up"),
        );
        let failure =
            std::panic::catch_unwind(AssertUnwindSafe(|| futures::executor::block_on(run)))
                .expect_err("a failing check fails the run");
        assert_eq!(
            failure.downcast_ref::<String>().map(String::as_str),
            Some("example conformance check `fails` failed: the expectation")
        );
        assert_eq!(*made.lock().unwrap(), 2, "one subject per check run");
        assert_eq!(
            *journal.lock().unwrap(),
            [
                "made",
                "passes ran",
                "cleaned up",
                "guard dropped",
                "made",
                "fails ran",
                "cleaned up",
                "guard dropped",
            ]
        );
    }
}
