//! The PKI step of a Cluster pass: which certificates the Cluster needs
//! ([`certificates`], a pure plan), which Secrets to write for them
//! ([`secrets`], pure), the authorities that are never made again
//! ([`authorities`]), and issuing and reading certificates ([`crypto`],
//! whose functions are re-exported here).

pub mod authorities;
pub mod certificates;
pub mod crypto;
pub mod encryption;
pub mod secrets;

pub use crypto::*;
