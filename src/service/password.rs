//! Password hashing with Argon2id (the argon2 crate's default parameters: 19 MiB, 2 passes).
//! Hashing is slow on purpose, so it runs on the blocking thread pool.

use std::sync::LazyLock;

use argon2::{
    Argon2, PasswordHash, PasswordHasher, PasswordVerifier,
    password_hash::{SaltString, rand_core::OsRng},
};

/// The PHC string of a new Argon2id hash of `password`.
pub async fn hash(password: String) -> String {
    tokio::task::spawn_blocking(move || hash_now(&password))
        .await
        .expect("hashing does not panic")
}

/// Hashes on the calling thread (the command line).
pub fn hash_now(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("Argon2 with default parameters hashes any password")
        .to_string()
}

/// A hash of a random password nobody knows: verifying against it takes as long as a real
/// check, so an unknown user name answers in about the same time as a wrong password.
static DECOY: LazyLock<String> = LazyLock::new(|| hash_now(&super::keys::generate_key("decoy")));

/// Whether `password` matches `stored` (a PHC string), or, when there is no such user, a
/// check against the decoy that always fails.
pub async fn verify(stored: Option<String>, password: String) -> bool {
    tokio::task::spawn_blocking(move || {
        let known = stored.is_some();
        let phc = stored.unwrap_or_else(|| DECOY.clone());
        let ok = PasswordHash::new(&phc).is_ok_and(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        });
        known && ok
    })
    .await
    .unwrap_or(false)
}

/// Computes the decoy now, so the first unknown-user login is not faster or slower.
pub fn warm_up() {
    LazyLock::force(&DECOY);
}

/// A new random password for a first admin: 24 characters from a 57-letter alphabet
/// without look-alikes (about 140 bits).
pub fn generate_password() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    let bytes = crate::support::ids::random_bytes::<24>();
    bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hash_verifies_only_its_password() {
        let h = hash("correct horse battery".into()).await;
        assert!(h.starts_with("$argon2id$"));
        assert!(verify(Some(h.clone()), "correct horse battery".into()).await);
        assert!(!verify(Some(h), "wrong horse battery".into()).await);
        assert!(!verify(None, "anything at all".into()).await);
    }

    #[test]
    fn generated_passwords_are_long() {
        let p = generate_password();
        assert_eq!(p.len(), 24);
        assert_ne!(p, generate_password());
    }
}
