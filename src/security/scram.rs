//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), as Kafka uses them
//! for SASL: the broker's side of the exchange, the client's side (for
//! shardlog's own tools and the replica fetchers between machines), and the
//! stored credential (salt, iterations, StoredKey, ServerKey: never the
//! password).
//!
//! Written here on RustCrypto's HMAC, SHA-2 and PBKDF2 because no open
//! source crate does the server side for both hashes: `scram` does SHA-256
//! only (on an old `ring`), and `scram-rs` is not under an open source
//! license. Channel binding is refused (`p=`), as Kafka refuses it; Kafka's
//! delegation-token extension (`tokenauth=true`) is refused too, since
//! shardlog has no delegation tokens.
//!
//! An unknown user fails exactly as a wrong password does, after the same
//! work (a made-up credential goes through the exchange), so the answers do
//! not tell which user names exist.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256, Sha512};

/// Kafka's bounds on a SCRAM credential's iterations (`ScramMechanism`).
pub const ITERATIONS_MIN: u32 = 4096;
pub const ITERATIONS_MAX: u32 = 16384;
/// Salt length of credentials made here (Kafka's `ScramFormatter` uses a
/// random salt of this order too).
const SALT_BYTES: usize = 32;
/// Random bytes in the server's part of the nonce.
const NONCE_BYTES: usize = 24;
/// A client message longer than this is refused before it is parsed.
pub const MESSAGE_BYTES_MAX: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hash {
    Sha256,
    Sha512,
}

impl Hash {
    /// The SASL mechanism name.
    pub fn mechanism(self) -> &'static str {
        match self {
            Hash::Sha256 => "SCRAM-SHA-256",
            Hash::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Kafka's `ScramMechanism` type (DescribeUserScramCredentials,
    /// AlterUserScramCredentials): 1 SHA-256, 2 SHA-512.
    pub fn kafka_type(self) -> i8 {
        match self {
            Hash::Sha256 => 1,
            Hash::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(kind: i8) -> Option<Self> {
        match kind {
            1 => Some(Hash::Sha256),
            2 => Some(Hash::Sha512),
            _ => None,
        }
    }

    pub fn from_mechanism(name: &str) -> Option<Self> {
        [Hash::Sha256, Hash::Sha512].into_iter().find(|h| h.mechanism().eq_ignore_ascii_case(name))
    }

    fn output_bytes(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha512 => 64,
        }
    }

    fn hmac(self, key: &[u8], data: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], data: &[&[u8]]) -> Vec<u8> {
            let mut mac = <M as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
            for part in data {
                mac.update(part);
            }
            mac.finalize().into_bytes().to_vec()
        }
        match self {
            Hash::Sha256 => run::<Hmac<Sha256>>(key, data),
            Hash::Sha512 => run::<Hmac<Sha512>>(key, data),
        }
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => Sha256::digest(data).to_vec(),
            Hash::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// Hi(password, salt, i): PBKDF2 with this HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.output_bytes()];
        match self {
            Hash::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out),
            Hash::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out),
        }
        out
    }
}

/// What the broker keeps of a user's password for one hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl Credential {
    /// From a salted password (what AlterUserScramCredentials carries).
    pub fn from_salted_password(hash: Hash, salted: &[u8], salt: &[u8], iterations: u32) -> Self {
        let client_key = hash.hmac(salted, &[b"Client Key"]);
        Credential {
            salt: salt.to_vec(),
            iterations,
            stored_key: hash.digest(&client_key),
            server_key: hash.hmac(salted, &[b"Server Key"]),
        }
    }

    /// From a password, with a fresh random salt.
    pub fn new(hash: Hash, password: &str, iterations: u32) -> Self {
        let salt = random_bytes(SALT_BYTES);
        let salted = hash.salted_password(password.as_bytes(), &salt, iterations);
        Self::from_salted_password(hash, &salted, &salt, iterations)
    }

    /// Whether `password` is this credential's (SASL/PLAIN checks a
    /// password against the stored SCRAM credential).
    pub fn matches_password(&self, hash: Hash, password: &str) -> bool {
        let salted = hash.salted_password(password.as_bytes(), &self.salt, self.iterations);
        let candidate = Self::from_salted_password(hash, &salted, &self.salt, self.iterations);
        equal_in_constant_time(&candidate.stored_key, &self.stored_key)
    }

    /// A credential no password matches, for unknown users.
    fn decoy(hash: Hash) -> Self {
        Credential {
            salt: random_bytes(SALT_BYTES),
            iterations: ITERATIONS_MIN,
            stored_key: random_bytes(hash.output_bytes()),
            server_key: random_bytes(hash.output_bytes()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The message breaks the grammar; the reason is for the log and the
    /// error message.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    /// Unknown user or wrong password (one answer for both).
    #[error("authentication failed: invalid user name or password")]
    BadCredentials,
    #[error("the server's signature does not match: it does not know this password")]
    ServerSignature,
    #[error("the SCRAM exchange is already over")]
    Finished,
}

/// The next thing the broker sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The server-first message; the client's final message comes next.
    Challenge(Vec<u8>),
    /// The client proved the password: `user` is authenticated, and
    /// `server_final` (the server's signature) goes back.
    Authenticated { user: String, server_final: Vec<u8> },
}

enum ServerState {
    AwaitingFirst,
    AwaitingFinal(Box<Expected>),
    Finished,
}

/// What the server-first message committed the server to.
struct Expected {
    user: String,
    known: bool,
    credential: Credential,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    client_nonce: String,
    nonce: String,
}

/// The broker's side of one exchange.
pub struct ScramServer {
    hash: Hash,
    state: ServerState,
}

impl ScramServer {
    pub fn new(hash: Hash) -> Self {
        ScramServer { hash, state: ServerState::AwaitingFirst }
    }

    /// Takes the client's next message; `lookup` finds a user's credential
    /// for this hash.
    pub fn step(
        &mut self,
        message: &[u8],
        lookup: &dyn Fn(&str) -> Option<Credential>,
    ) -> Result<Progress, ScramError> {
        let state = std::mem::replace(&mut self.state, ServerState::Finished);
        match state {
            ServerState::AwaitingFirst => self.first(message, lookup),
            ServerState::AwaitingFinal(expected) => {
                let Expected {
                    user,
                    known,
                    credential,
                    gs2_header,
                    client_first_bare,
                    server_first,
                    client_nonce,
                    nonce,
                } = *expected;
                let text = text_of(message)?;
                let (without_proof, proof) =
                    text.rsplit_once(",p=").ok_or(ScramError::Malformed("the final message has no proof"))?;
                let mut fields = without_proof.split(',');
                let binding = fields
                    .next()
                    .and_then(|f| f.strip_prefix("c="))
                    .ok_or(ScramError::Malformed("the final message does not start with c="))?;
                if BASE64.decode(binding).ok().as_deref() != Some(gs2_header.as_bytes()) {
                    return Err(ScramError::Malformed("the channel binding does not repeat the gs2 header"));
                }
                let echoed = fields
                    .next()
                    .and_then(|f| f.strip_prefix("r="))
                    .ok_or(ScramError::Malformed("the final message has no nonce"))?;
                // librdkafka before 2.6.1 (confluentinc/librdkafka#4895) sends
                // its own nonce again in front of the server's whole nonce;
                // that form still carries the server's fresh part.
                let librdkafka_form = echoed.strip_prefix(client_nonce.as_str()) == Some(nonce.as_str());
                if echoed != nonce && !librdkafka_form {
                    return Err(ScramError::Malformed("the nonce is not the one the server sent"));
                }
                let proof = BASE64.decode(proof).map_err(|_| ScramError::Malformed("the proof is not base64"))?;
                if proof.len() != self.hash.output_bytes() {
                    return Err(ScramError::Malformed("the proof has the wrong length"));
                }
                let auth_message =
                    [client_first_bare.as_bytes(), b",", server_first.as_bytes(), b",", without_proof.as_bytes()];
                let client_signature = self.hash.hmac(&credential.stored_key, &auth_message);
                let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(p, s)| p ^ s).collect();
                let proven = equal_in_constant_time(&self.hash.digest(&client_key), &credential.stored_key);
                if !(proven && known) {
                    return Err(ScramError::BadCredentials);
                }
                let server_signature = self.hash.hmac(&credential.server_key, &auth_message);
                let server_final = format!("v={}", BASE64.encode(server_signature)).into_bytes();
                Ok(Progress::Authenticated { user, server_final })
            }
            ServerState::Finished => Err(ScramError::Finished),
        }
    }

    fn first(&mut self, message: &[u8], lookup: &dyn Fn(&str) -> Option<Credential>) -> Result<Progress, ScramError> {
        let text = text_of(message)?;
        let (gs2_header, bare) = split_gs2_header(text)?;
        let mut fields = bare.split(',');
        let user = fields
            .next()
            .and_then(|f| f.strip_prefix("n="))
            .ok_or(ScramError::Malformed("the first message has no user name (n=)"))
            .and_then(decode_sasl_name)?;
        let client_nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .filter(|n| !n.is_empty())
            .ok_or(ScramError::Malformed("the first message has no nonce (r=)"))?;
        for extension in fields {
            if extension.starts_with("tokenauth=") {
                return Err(ScramError::Unsupported("delegation-token authentication"));
            }
            if extension.starts_with("m=") {
                return Err(ScramError::Unsupported("a mandatory SCRAM extension"));
            }
        }
        if let Some(authzid) = gs2_header.split(',').nth(1).and_then(|a| a.strip_prefix("a=")) {
            if decode_sasl_name(authzid)? != user {
                return Err(ScramError::Unsupported("an authorization id other than the user"));
            }
        }
        let (known, credential) = match lookup(&user) {
            Some(credential) => (true, credential),
            None => (false, Credential::decoy(self.hash)),
        };
        let nonce = format!("{client_nonce}{}", BASE64.encode(random_bytes(NONCE_BYTES)));
        let server_first = format!("r={nonce},s={},i={}", BASE64.encode(&credential.salt), credential.iterations);
        let challenge = server_first.clone().into_bytes();
        self.state = ServerState::AwaitingFinal(Box::new(Expected {
            user,
            known,
            credential,
            gs2_header: gs2_header.to_string(),
            client_first_bare: bare.to_string(),
            server_first,
            client_nonce: client_nonce.to_string(),
            nonce,
        }));
        Ok(Progress::Challenge(challenge))
    }
}

/// The client's side of one exchange (no authorization id, no channel
/// binding).
pub struct ScramClient {
    hash: Hash,
    password: String,
    client_first_bare: String,
    client_nonce: String,
    expected_server_signature: Option<Vec<u8>>,
}

impl ScramClient {
    pub fn new(hash: Hash, user: &str, password: &str) -> Self {
        let client_nonce = BASE64.encode(random_bytes(NONCE_BYTES));
        let client_first_bare = format!("n={},r={client_nonce}", encode_sasl_name(user));
        ScramClient {
            hash,
            password: password.to_string(),
            client_first_bare,
            client_nonce,
            expected_server_signature: None,
        }
    }

    /// The client-first message.
    pub fn first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// Answers the server-first message with the client-final one.
    pub fn answer(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let server_first = text_of(server_first)?;
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for field in server_first.split(',') {
            if let Some(value) = field.strip_prefix("r=") {
                nonce = Some(value);
            } else if let Some(value) = field.strip_prefix("s=") {
                salt = BASE64.decode(value).ok();
            } else if let Some(value) = field.strip_prefix("i=") {
                iterations = value.parse::<u32>().ok();
            } else if field.starts_with("e=") {
                return Err(ScramError::BadCredentials);
            }
        }
        let nonce = nonce
            .filter(|n| n.starts_with(&self.client_nonce) && n.len() > self.client_nonce.len())
            .ok_or(ScramError::Malformed("the server's nonce does not extend the client's"))?;
        let salt = salt.ok_or(ScramError::Malformed("the server sent no salt"))?;
        let iterations = iterations
            .filter(|i| (ITERATIONS_MIN..=ITERATIONS_MAX).contains(i))
            .ok_or(ScramError::Malformed("the server's iteration count is missing or out of range"))?;
        let without_proof = format!("c=biws,r={nonce}");
        let salted = self.hash.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = self.hash.hmac(&salted, &[b"Client Key"]);
        let stored_key = self.hash.digest(&client_key);
        let auth_message =
            [self.client_first_bare.as_bytes(), b",", server_first.as_bytes(), b",", without_proof.as_bytes()];
        let client_signature = self.hash.hmac(&stored_key, &auth_message);
        let proof: Vec<u8> = client_key.iter().zip(&client_signature).map(|(k, s)| k ^ s).collect();
        let server_key = self.hash.hmac(&salted, &[b"Server Key"]);
        self.expected_server_signature = Some(self.hash.hmac(&server_key, &auth_message));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message (the server knew the password).
    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let text = text_of(server_final)?;
        if text.starts_with("e=") {
            return Err(ScramError::BadCredentials);
        }
        let signature = text
            .strip_prefix("v=")
            .and_then(|v| BASE64.decode(v).ok())
            .ok_or(ScramError::Malformed("the server-final message has no signature"))?;
        match &self.expected_server_signature {
            Some(expected) if equal_in_constant_time(expected, &signature) => Ok(()),
            Some(_) => Err(ScramError::ServerSignature),
            None => Err(ScramError::Malformed("the server-final message came before the server-first")),
        }
    }
}

fn text_of(message: &[u8]) -> Result<&str, ScramError> {
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(ScramError::Malformed("the message is too long"));
    }
    std::str::from_utf8(message).map_err(|_| ScramError::Malformed("the message is not UTF-8"))
}

/// Splits `gs2-cbind-flag "," [authzid] ","` off the client-first message.
fn split_gs2_header(text: &str) -> Result<(&str, &str), ScramError> {
    let flag_end = text.find(',').ok_or(ScramError::Malformed("the first message has no gs2 header"))?;
    match &text[..flag_end] {
        "n" | "y" => {}
        flag if flag.starts_with("p=") => return Err(ScramError::Unsupported("channel binding")),
        _ => return Err(ScramError::Malformed("the gs2 header's channel-binding flag is not n, y or p=")),
    }
    let authzid_end = text[flag_end + 1..]
        .find(',')
        .map(|i| flag_end + 1 + i)
        .ok_or(ScramError::Malformed("the gs2 header does not end"))?;
    let authzid = &text[flag_end + 1..authzid_end];
    if !(authzid.is_empty() || authzid.starts_with("a=")) {
        return Err(ScramError::Malformed("the gs2 header's authorization id is not a="));
    }
    Ok((&text[..=authzid_end], &text[authzid_end + 1..]))
}

/// RFC 5802 saslname: `=2C` is `,` and `=3D` is `=`; no other `=`.
fn decode_sasl_name(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        match rest.get(at..at + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("a user name has an = that is not =2C or =3D")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(ScramError::Malformed("the user name is empty"));
    }
    Ok(out)
}

fn encode_sasl_name(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Bytes from the operating system's random source.
pub fn random_bytes(count: usize) -> Vec<u8> {
    let mut out = vec![0u8; count];
    getrandom::fill(&mut out).expect("the OS random source works");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(hash: Hash, user: &'static str, password: &str) -> impl Fn(&str) -> Option<Credential> {
        let credential = Credential::new(hash, password, ITERATIONS_MIN);
        move |name: &str| (name == user).then(|| credential.clone())
    }

    fn exchange(
        hash: Hash,
        lookup: &dyn Fn(&str) -> Option<Credential>,
        user: &str,
        password: &str,
    ) -> Result<String, ScramError> {
        let mut client = ScramClient::new(hash, user, password);
        let mut server = ScramServer::new(hash);
        let Progress::Challenge(server_first) = server.step(&client.first(), lookup)? else {
            panic!("the first step must challenge");
        };
        let client_final = client.answer(&server_first)?;
        match server.step(&client_final, lookup)? {
            Progress::Authenticated { user, server_final } => {
                client.verify(&server_final)?;
                Ok(user)
            }
            Progress::Challenge(_) => panic!("the second step must end the exchange"),
        }
    }

    #[test]
    fn the_rfc_7677_example_proof_and_signature_come_out() {
        // RFC 7677 section 3: user "user", password "pencil".
        let hash = Hash::Sha256;
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = hash.salted_password(b"pencil", &salt, 4096);
        let credential = Credential::from_salted_password(hash, &salted, &salt, 4096);
        let client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let without_proof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let auth = [client_first_bare.as_bytes(), b",", server_first.as_bytes(), b",", without_proof.as_bytes()];
        let client_key = hash.hmac(&salted, &[b"Client Key"]);
        let signature = hash.hmac(&credential.stored_key, &auth);
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(k, s)| k ^ s).collect();
        assert_eq!(BASE64.encode(proof), "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
        assert_eq!(
            BASE64.encode(hash.hmac(&credential.server_key, &auth)),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    #[test]
    fn the_right_password_authenticates_with_both_hashes() {
        for hash in [Hash::Sha256, Hash::Sha512] {
            let lookup = store(hash, "alice", "s3cret");
            assert_eq!(exchange(hash, &lookup, "alice", "s3cret"), Ok("alice".to_string()));
        }
    }

    #[test]
    fn a_wrong_password_and_an_unknown_user_fail_alike() {
        let lookup = store(Hash::Sha512, "alice", "s3cret");
        assert_eq!(exchange(Hash::Sha512, &lookup, "alice", "guess"), Err(ScramError::BadCredentials));
        assert_eq!(exchange(Hash::Sha512, &lookup, "mallory", "s3cret"), Err(ScramError::BadCredentials));
    }

    #[test]
    fn a_credential_of_the_other_hash_does_not_authenticate() {
        let lookup = store(Hash::Sha256, "alice", "s3cret");
        assert_eq!(exchange(Hash::Sha512, &lookup, "alice", "s3cret"), Err(ScramError::BadCredentials));
    }

    #[test]
    fn user_names_with_commas_and_equals_signs_travel_escaped() {
        let lookup = store(Hash::Sha256, "a,b=c", "pw");
        assert_eq!(exchange(Hash::Sha256, &lookup, "a,b=c", "pw"), Ok("a,b=c".to_string()));
        assert!(matches!(decode_sasl_name("a=2"), Err(ScramError::Malformed(_))));
    }

    #[test]
    fn channel_binding_tokens_and_bad_grammar_are_refused() {
        let lookup = store(Hash::Sha256, "alice", "pw");
        let refuse = |message: &str| ScramServer::new(Hash::Sha256).step(message.as_bytes(), &lookup).unwrap_err();
        assert_eq!(refuse("p=tls-unique,,n=alice,r=abc"), ScramError::Unsupported("channel binding"));
        assert_eq!(
            refuse("n,,n=alice,r=abc,tokenauth=true"),
            ScramError::Unsupported("delegation-token authentication")
        );
        assert_eq!(refuse("n,a=bob,n=alice,r=abc"), ScramError::Unsupported("an authorization id other than the user"));
        assert!(matches!(refuse("n,,r=abc"), ScramError::Malformed(_)));
        assert!(matches!(refuse("n,,n=alice"), ScramError::Malformed(_)));
        assert!(matches!(refuse("x,,n=alice,r=abc"), ScramError::Malformed(_)));
        assert!(matches!(refuse(""), ScramError::Malformed(_)));
        assert!(matches!(refuse(&"n".repeat(MESSAGE_BYTES_MAX + 1)), ScramError::Malformed(_)));
        let invalid_utf8 = ScramServer::new(Hash::Sha256).step(&[0xff, 0xfe], &lookup).unwrap_err();
        assert!(matches!(invalid_utf8, ScramError::Malformed(_)));
    }

    #[test]
    fn a_final_message_with_another_nonce_or_binding_is_refused() {
        let lookup = store(Hash::Sha256, "alice", "pw");
        let mut client = ScramClient::new(Hash::Sha256, "alice", "pw");
        let mut server = ScramServer::new(Hash::Sha256);
        let Ok(Progress::Challenge(first)) = server.step(&client.first(), &lookup) else { panic!() };
        let good = String::from_utf8(client.answer(&first).unwrap()).unwrap();
        let mut other_nonce = ScramServer::new(Hash::Sha256);
        other_nonce.step(&client.first(), &lookup).unwrap();
        assert!(matches!(other_nonce.step(good.as_bytes(), &lookup), Err(ScramError::Malformed(_))));
        let rebound = good.replacen("c=biws", "c=eSws", 1);
        assert!(matches!(server.step(rebound.as_bytes(), &lookup), Err(ScramError::Malformed(_))));
        assert_eq!(server.step(good.as_bytes(), &lookup), Err(ScramError::Finished));
    }

    #[test]
    fn librdkafka_before_2_6_1_repeating_its_nonce_still_authenticates() {
        let hash = Hash::Sha256;
        let lookup = store(hash, "alice", "pw");
        let client = ScramClient::new(hash, "alice", "pw");
        let mut server = ScramServer::new(hash);
        let Ok(Progress::Challenge(first)) = server.step(&client.first(), &lookup) else { panic!() };
        let server_first = String::from_utf8(first).unwrap();
        let field = |name: &str| server_first.split(',').find_map(|f| f.strip_prefix(name)).unwrap().to_string();
        let (nonce, salt, iterations) =
            (field("r="), BASE64.decode(field("s=")).unwrap(), field("i=").parse().unwrap());
        // As old librdkafka answers: r = its own nonce + the server's whole nonce.
        let without_proof = format!("c=biws,r={}{nonce}", client.client_nonce);
        let salted = hash.salted_password(b"pw", &salt, iterations);
        let client_key = hash.hmac(&salted, &[b"Client Key"]);
        let auth = [client.client_first_bare.as_bytes(), b",", server_first.as_bytes(), b",", without_proof.as_bytes()];
        let signature = hash.hmac(&hash.digest(&client_key), &auth);
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(k, s)| k ^ s).collect();
        let last = format!("{without_proof},p={}", BASE64.encode(proof));
        assert!(matches!(server.step(last.as_bytes(), &lookup), Ok(Progress::Authenticated { .. })));
        // Any other nonce is still refused.
        let mut other = ScramServer::new(hash);
        other.step(&client.first(), &lookup).unwrap();
        assert!(matches!(other.step(last.as_bytes(), &lookup), Err(ScramError::Malformed(_))));
    }

    #[test]
    fn plain_passwords_are_checked_against_the_stored_credential() {
        let credential = Credential::new(Hash::Sha512, "s3cret", ITERATIONS_MIN);
        assert!(credential.matches_password(Hash::Sha512, "s3cret"));
        assert!(!credential.matches_password(Hash::Sha512, "s3cret "));
    }

    #[test]
    fn a_client_refuses_a_server_that_does_not_know_the_password() {
        let lookup = store(Hash::Sha256, "alice", "other");
        let mut client = ScramClient::new(Hash::Sha256, "alice", "pw");
        let mut server = ScramServer::new(Hash::Sha256);
        let Ok(Progress::Challenge(first)) = server.step(&client.first(), &lookup) else { panic!() };
        client.answer(&first).unwrap();
        let forged = format!("v={}", BASE64.encode([7u8; 32]));
        assert_eq!(client.verify(forged.as_bytes()), Err(ScramError::ServerSignature));
    }
}
