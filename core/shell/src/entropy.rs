//! Random bytes from the OS, fetched a page at a time: a 2026-07-28 request's routing key
//! and a sampled request's span ids need fresh bytes for every request, and one
//! `getrandom` call per request was a visible share of a call's cost.

use std::cell::RefCell;

/// How many bytes one `getrandom` call fetches for a thread.
const POOL: usize = 4096;

thread_local! {
    /// This thread's unused random bytes: `(bytes, how many are used)`.
    static BYTES: RefCell<(Box<[u8; POOL]>, usize)> = RefCell::new((Box::new([0; POOL]), POOL));
}

/// `N` random bytes (at most a page), each handed out once and then wiped from the pool.
pub fn entropy<const N: usize>() -> [u8; N] {
    const { assert!(N <= POOL) };
    BYTES.with_borrow_mut(|(bytes, used)| {
        if *used + N > POOL {
            getrandom::fill(&mut bytes[..]).expect("the OS random source works");
            *used = 0;
        }
        let taken = &mut bytes[*used..*used + N];
        let mut out = [0u8; N];
        out.copy_from_slice(taken);
        taken.fill(0);
        *used += N;
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_never_handed_out_twice() {
        let draws: Vec<[u8; 16]> = (0..1000).map(|_| entropy()).collect();
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert_eq!(distinct.len(), draws.len());
        assert!(draws.iter().all(|d| d != &[0; 16]));
        let wide: [u8; 32] = entropy();
        assert_ne!(wide, [0; 32]);
    }
}
