//! A failed backup attempt as the Cluster's condition tells it: a leaf the
//! schedule and the gateway both report through.

/// A failed attempt: the condition's reason and what to tell the user.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) reason: String,
    pub(super) message: String,
}

impl Failure {
    pub(super) fn new(reason: &str, message: impl Into<String>) -> Failure {
        Failure {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// From a category such as `backup-denied`: `BackupDenied`.
    pub(super) fn categorized(category: &str, message: impl Into<String>) -> Failure {
        let reason = category
            .split('-')
            .map(|word| {
                let mut chars = word.chars();
                chars.next().map_or(String::new(), |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect::<String>();
        Failure {
            reason,
            message: message.into(),
        }
    }
}
