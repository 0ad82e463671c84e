//! The unit tests of `src/store/coalesce.rs`.

use super::*;
use proptest::prelude::*;

/// A check of the state keys `keys`, and the receiver its answer would reach.
fn job(keys: &[&str]) -> (Counted, oneshot::Receiver<Result<Answer, StoreError>>) {
    let (reply, answer) = oneshot::channel();
    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    let check = Counted {
        hashes: keys.iter().map(|k| key_hash(k)).collect(),
        work: keys.len(),
        sent: Default::default(),
        rules: Vec::new(),
        labels: Vec::new(),
        rate_key: String::new(),
        cost: 1,
        context: crate::store::CheckContext::new(&[], crate::store::Now::Redis),
        trace: None,
        queued: Instant::now(),
        reply,
        keys,
    };
    (check, answer)
}

fn calls() -> Calls {
    Calls {
        pending: VecDeque::new(),
        pending_keys: HashSet::new(),
        busy: HashSet::new(),
        timeout: std::time::Duration::from_secs(60),
    }
}

fn keys_of(batch: &[Counted]) -> Vec<String> {
    batch.iter().map(|c| c.keys.join("+")).collect()
}

#[test]
fn a_check_sharing_a_key_with_a_call_out_waits_and_so_do_those_behind_it_on_its_keys() {
    let (tx, mut rx) = mpsc::channel(16);
    let mut calls = calls();
    let mut answers = Vec::new();
    let (first, a) = job(&["x"]);
    answers.push(a);
    let batch = calls.next_batch(false, Some(first), &mut rx);
    assert_eq!(keys_of(&batch), ["x"]);
    // x is out now; queue: x, y, x+z, z, w.
    for keys in [&["x"][..], &["y"], &["x", "z"], &["z"], &["w"]] {
        let (check, a) = job(keys);
        answers.push(a);
        tx.try_send(check).ok().unwrap();
    }
    let second = calls.next_batch(false, None, &mut rx);
    assert_eq!(keys_of(&second), ["y", "w"]);
    assert_eq!(keys_of(calls.pending.make_contiguous()), ["x", "x+z", "z"]);
    // Nothing else may go while x is out, not z (behind x+z), not a new z or x.
    for keys in [&["z"][..], &["x"], &["v"]] {
        let (check, a) = job(keys);
        answers.push(a);
        tx.try_send(check).ok().unwrap();
    }
    let third = calls.next_batch(true, None, &mut rx);
    assert_eq!(keys_of(&third), ["v"]);
    assert_eq!(
        keys_of(calls.pending.make_contiguous()),
        ["x", "x+z", "z", "z", "x"]
    );
    // The first call is back: the rest go, in their order, in one call.
    calls.returned(&batch);
    let fourth = calls.next_batch(true, None, &mut rx);
    assert_eq!(keys_of(&fourth), ["x", "x+z", "z", "z", "x"]);
    assert!(calls.pending.is_empty() && calls.pending_keys.is_empty());
    calls.returned(&second);
    calls.returned(&third);
    calls.returned(&fourth);
    assert!(calls.busy.is_empty());
}

#[test]
fn a_call_stops_at_max_work_and_keeps_the_rest_in_order() {
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let mut calls = calls();
    let mut answers = Vec::new();
    for i in 0..MAX_WORK + 44 {
        let (check, a) = job(&[&format!("k{i}")]);
        answers.push(a);
        tx.try_send(check).ok().unwrap();
    }
    let batch = calls.next_batch(false, None, &mut rx);
    assert_eq!(batch.len(), MAX_WORK);
    let rest = calls.next_batch(true, None, &mut rx);
    assert_eq!(rest.len(), 44);
    assert_eq!(rest[0].keys[0], format!("k{MAX_WORK}"));
}

/// A costly check (a bucketed window of 3,600 buckets, a long sliding log) goes in a
/// call of its own: the cheap checks around it (sharing no key with it) go together in
/// one call, and it goes alone in the next; none is lost.
#[test]
fn a_costly_check_goes_alone() {
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let mut calls = calls();
    let mut answers = Vec::new();
    for i in 0..6 {
        let (mut check, a) = job(&[&format!("k{i}")]);
        if i == 2 {
            check.work = work_of(&Algorithm::BucketedWindow {
                limit: 10,
                window_ms: 3_600_000,
                bucket_ms: 1000,
            });
            assert!(check.work >= ALONE);
        }
        answers.push(a);
        tx.try_send(check).ok().unwrap();
    }
    let first = calls.next_batch(false, None, &mut rx);
    assert_eq!(keys_of(&first), ["k0", "k1", "k3", "k4", "k5"]);
    calls.returned(&first);
    let second = calls.next_batch(true, None, &mut rx);
    assert_eq!(keys_of(&second), ["k2"]);
    calls.returned(&second);
    // Once it is out, the next call may not join it: a costly check fills its call.
    let (check, a) = job(&["k6"]);
    answers.push(a);
    tx.try_send(check).ok().unwrap();
    let (costly, a) = job(&["k7"]);
    answers.push(a);
    let mut costly = costly;
    costly.work = ALONE;
    let alone = calls.next_batch(false, Some(costly), &mut rx);
    assert_eq!(keys_of(&alone), ["k7"]);
    let third = calls.next_batch(true, None, &mut rx);
    assert_eq!(keys_of(&third), ["k6"]);
    // Ordinary rules weigh one entry each; a short log too.
    for cheap in [
        Algorithm::FixedWindow {
            limit: 10,
            window_ms: 1000,
        },
        Algorithm::SlidingLog {
            limit: 1000,
            window_ms: 1000,
        },
    ] {
        assert_eq!(work_of(&cheap), 1);
    }
    let longest = Algorithm::SlidingLog {
        limit: 100_000,
        window_ms: 1000,
    };
    assert_eq!(work_of(&longest), ALONE);
}

/// Checks whose callers gave up take no room in a call: behind 256 of them on a busy
/// key, a live check still goes when the key is free, and each dead one is answered.
#[test]
fn checks_nobody_waits_for_are_dropped_before_they_take_room() {
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let mut calls = calls();
    let (first, _kept) = job(&["hot"]);
    let out = calls.next_batch(false, Some(first), &mut rx);
    let mut dead = Vec::new();
    for _ in 0..MAX_WORK {
        let (check, answer) = job(&["hot"]);
        dead.push(answer);
        tx.try_send(check).ok().unwrap();
    }
    let (live, mut live_answer) = job(&["hot"]);
    tx.try_send(live).ok().unwrap();
    let none = calls.next_batch(false, None, &mut rx);
    assert!(none.is_empty());
    assert_eq!(calls.pending.len(), MAX_WORK + 1);
    // The first 256 callers give up (their timeout passed: they dropped their answer).
    drop(dead);
    calls.returned(&out);
    let batch = calls.next_batch(true, None, &mut rx);
    assert_eq!(batch.len(), 1, "the live check goes");
    assert!(calls.pending.is_empty());
    assert!(
        live_answer.try_recv().is_err(),
        "not answered before its call"
    );
}

proptest! {
    /// Whatever the checks and the keys out: no check goes out beside a call that holds
    /// one of its keys, and of two checks that share a key the later never goes before
    /// the earlier; nothing is lost or reordered.
    #[test]
    fn calls_out_together_share_no_key_and_each_key_keeps_its_order(
        checks in prop::collection::vec(prop::collection::vec(0u8..6, 1..3), 1..40),
        out in prop::collection::vec(0u8..6, 0..3),
    ) {
        let (tx, mut rx) = mpsc::channel(64);
        let mut calls = calls();
        let name = |k: &u8| format!("k{k}");
        calls.busy.extend(out.iter().map(|k| key_hash(&name(k))));
        let mut answers = Vec::new();
        for (i, keys) in checks.iter().enumerate() {
            let mut keys: Vec<String> = keys.iter().map(name).collect();
            keys.push(format!("own{i}"));
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let (check, a) = job(&refs);
            answers.push(a);
            tx.try_send(check).ok().unwrap();
        }
        let batch = calls.next_batch(false, None, &mut rx);
        let index = |c: &Counted| c.keys.last().unwrap()[3..].parse::<usize>().unwrap();
        let sent: Vec<usize> = batch.iter().map(index).collect();
        let left: Vec<usize> = calls.pending.iter().map(index).collect();
        // nothing lost, each part in order
        let mut all = [sent.clone(), left.clone()].concat();
        prop_assert!(sent.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(left.windows(2).all(|w| w[0] < w[1]));
        all.sort();
        prop_assert_eq!(all, (0..checks.len()).collect::<Vec<_>>());
        for &s in &sent {
            // not beside a call out
            prop_assert!(!checks[s].iter().any(|k| out.contains(k)));
            // not ahead of an earlier check of one of its keys that was left
            for &l in &left {
                prop_assert!(!(l < s && checks[l].iter().any(|k| checks[s].contains(k))));
            }
        }
    }
}

#[test]
fn a_batch_reply_is_split_per_check() {
    // now, check 1 (1 entry, allowed), check 2 (2 entries, denied by the second)
    let raw = [
        7, 1, 1, 10, 9, 1000, -1, 0, 0, 1, 5, 4, 500, -1, 0, 0, 3, 0, 200, 200, 0,
    ];
    let out = parse_batch(&raw, &[1, 2]).unwrap();
    assert_eq!(out.len(), 2);
    let (first, second) = (out[0].as_ref().unwrap(), out[1].as_ref().unwrap());
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].remaining, 9);
    assert_eq!(second.len(), 2);
    assert!(second[0].allowed);
    assert!(!second[1].allowed);
    assert_eq!(second[1].retry_after_ms, Some(200));
    // A reply of the wrong length is an error, not a misattributed answer.
    assert!(parse_batch(&raw[..raw.len() - 1], &[1, 2]).is_err());
    assert!(parse_batch(&raw, &[2, 1, 1]).is_err());
}

#[test]
fn a_failed_check_fails_alone() {
    // check 0 (1 entry) failed, check 1 (1 entry) allowed
    let text = "7,-1,0,0,0,0,0,0,1,1,10,9,1000,-1,0\n0:WRONGTYPE Operation against a key";
    let (now, out) = parse_batch_text(text, &[1, 1]).unwrap();
    assert_eq!(now, 7);
    assert!(matches!(&out[0], Err(StoreError::Script(m)) if m.starts_with("WRONGTYPE")));
    assert_eq!(out[1].as_ref().unwrap()[0].remaining, 9);
    // A failure line without its marked check, or the reverse, is a broken reply.
    assert!(
        parse_batch_text("7,1,1,10,9,1000,-1,0,-1,0,0,0,0,0,0", &[1, 1])
            .unwrap()
            .1[1]
            .is_err()
    );
    assert!(parse_batch_text("7,1,1,10,9,1000,-1,0\n3:oops", &[1]).is_err());
    assert!(parse_batch_text("7,1,1,10,9,1000,-1,0\nnonsense", &[1]).is_err());
}

#[test]
fn the_batch_reply_string_reads_as_redis_would_read_lua_numbers() {
    assert_eq!(
        integers("1763860000123456,1,-1,0,2.5,1e+15").unwrap(),
        [1_763_860_000_123_456, 1, -1, 0, 2, 1_000_000_000_000_000]
    );
    assert!(integers("1,,2").is_err());
    assert!(integers("1,nan").is_err());
    assert!(integers("oops").is_err());
}
