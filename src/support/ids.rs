//! Random identifiers and their hex text: session ids, API keys, alert and delivery ids,
//! instance names. One generator (the OS's) and one spelling (lowercase hex) for all.

/// `N` random bytes from the OS's generator.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the OS random generator works");
    bytes
}

/// Lowercase hex.
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A random id of `N` bytes, as hex (`2 * N` characters).
pub fn random_hex<const N: usize>() -> String {
    to_hex(&random_bytes::<N>())
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_lowercase_and_two_digits_a_byte() {
        assert_eq!(super::to_hex(&[0, 1, 0xab, 0xff]), "0001abff");
        assert_eq!(super::random_hex::<8>().len(), 16);
        assert_ne!(super::random_hex::<16>(), super::random_hex::<16>());
    }
}
