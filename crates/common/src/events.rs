//! Events on the objects the operators manage: one publisher, so every
//! Event gets the same treatment (notes cut to what the API stores, a
//! failure to publish logged and never failing a reconcile).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

/// The most of a note the Events API stores (1 kB): a longer note is
/// refused, and its Event lost with it.
pub const NOTE_LIMIT: usize = 1024;

/// `text` cut to [`NOTE_LIMIT`] bytes at a character boundary, ending in
/// `…` when cut.
pub fn note(text: &str) -> String {
    clip(text, NOTE_LIMIT)
}

/// `text` cut to `limit` bytes at a character boundary, ending in `…` when
/// cut.
pub fn clip(text: &str, limit: usize) -> String {
    const MORE: &str = "…";
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit.saturating_sub(MORE.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MORE}", &text[..end])
}

/// Publish an Event about `regarding` (and `related`, if any). The
/// recorder counts Events of one reason and action as one series whatever
/// their notes say; Events about different related objects stay apart.
pub async fn publish(
    recorder: &Recorder,
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
    related: Option<ObjectReference>,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(self::note(note)),
        action: action.into(),
        secondary: related,
    };
    if let Err(error) = recorder.publish(&event, regarding).await {
        tracing::debug!(
            object = regarding.name.as_deref().unwrap_or_default(),
            reason,
            %error,
            "cannot publish an event"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_to_what_the_api_stores_at_a_character_boundary() {
        assert_eq!(note("short"), "short");
        let exact = "a".repeat(NOTE_LIMIT);
        assert_eq!(note(&exact), exact);
        // Two-byte characters: the cut never splits one.
        let long = "é".repeat(NOTE_LIMIT);
        let cut = note(&long);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }
}
