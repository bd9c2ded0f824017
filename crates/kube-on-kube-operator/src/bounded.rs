//! Bounded reads: what the operator lists of a namespace on every pass (a
//! Cluster's labelled objects, add-on template ConfigMaps) is read page by
//! page and capped in count and bytes, so one namespace full of large
//! labelled objects cannot exhaust the operator's memory for every Cluster
//! (see "Bounded reads" in `docs/security.md`).

use kube::Resource;
use kube::api::{Api, ListParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Flag of [`Limits::max_objects`].
pub const MAX_OBJECTS_FLAG: &str = "--max-listed-objects";
/// Flag of [`Limits::max_bytes`].
pub const MAX_BYTES_FLAG: &str = "--max-listed-bytes";
/// Flag of [`Limits::max_template_bytes`].
pub const MAX_TEMPLATE_BYTES_FLAG: &str = "--max-addon-template-bytes";

/// Reason of the `Allowed` condition of a Cluster whose namespace holds
/// more than a list may return.
pub const TOO_MANY_OBJECTS: &str = "TooManyObjects";

/// Objects one list request returns at most: what is held of a list beyond
/// what is kept of it.
pub const PAGE: u32 = 32;

/// The operator's limits on what it reads per list (see the flags in
/// `main.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Objects one list of a namespace (one kind, one label selector) may
    /// return in all.
    pub max_objects: usize,
    /// Bytes (as JSON) the objects of one such list may hold in all.
    pub max_bytes: usize,
    /// Bytes the data of one add-on template ConfigMap may hold.
    pub max_template_bytes: usize,
    /// Objects per list request.
    pub page: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_objects: 500,
            max_bytes: 32 << 20,
            max_template_bytes: 256 << 10,
            page: PAGE,
        }
    }
}

/// The flags that set [`Limits`].
#[derive(clap::Args, Debug, Clone)]
pub struct LimitArgs {
    /// Objects one list of a namespace may return: a Cluster's Secrets,
    /// Services, Deployments, Pods or claims (the objects labelled
    /// `kubeonkube.io/cluster=<name>`), or its namespace's add-on template
    /// ConfigMaps. A Cluster whose namespace holds more gets the condition
    /// `Allowed=False` (reason `TooManyObjects`) and is not changed until
    /// they are removed; other Clusters are not affected.
    #[arg(long, env = "KOK_MAX_LISTED_OBJECTS", default_value_t = Limits::default().max_objects)]
    pub max_listed_objects: usize,
    /// Bytes (as JSON) the objects of one such list may hold in all, as
    /// `33554432`, `32Mi` or `512Ki`. Lists are read 32 objects at a time and
    /// the read stops as soon as this is exceeded (same condition as
    /// `--max-listed-objects`).
    #[arg(long, env = "KOK_MAX_LISTED_BYTES", default_value = "32Mi", value_parser = parse_bytes)]
    pub max_listed_bytes: usize,
    /// Bytes the data of one add-on template ConfigMap may hold, as `262144`
    /// or `256Ki`. A larger template is not parsed or kept: it is unusable,
    /// and a Cluster asking for its add-on says so in `AddonsReady`.
    #[arg(long, env = "KOK_MAX_ADDON_TEMPLATE_BYTES", default_value = "256Ki", value_parser = parse_bytes)]
    pub max_addon_template_bytes: usize,
}

impl LimitArgs {
    /// The limits these flags set.
    pub fn limits(&self) -> Limits {
        Limits {
            max_objects: self.max_listed_objects,
            max_bytes: self.max_listed_bytes,
            max_template_bytes: self.max_addon_template_bytes,
            page: PAGE,
        }
    }
}

/// A byte count: plain, or with a `Ki`, `Mi` or `Gi` suffix.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (digits, unit) = match text {
        t if t.ends_with("Ki") => (&t[..t.len() - 2], 1usize << 10),
        t if t.ends_with("Mi") => (&t[..t.len() - 2], 1 << 20),
        t if t.ends_with("Gi") => (&t[..t.len() - 2], 1 << 30),
        t => (t, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} is not a byte count such as 262144, 256Ki or 32Mi"))
}

/// A list that would hold more than the limits allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{kind}s labelled {selector} in namespace {namespace} hold more than {limit} (the operator's {flag}): \
     remove the ones the operator did not create; until then this Cluster is not changed"
)]
pub struct Exceeded {
    pub kind: String,
    pub namespace: String,
    pub selector: String,
    /// What was exceeded, as the flag counts it (`500 objects`, `33554432 bytes`).
    pub limit: String,
    pub flag: &'static str,
}

/// What a list has taken so far, against the limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub objects: usize,
    pub bytes: usize,
}

/// Which limit one more object of `bytes` would exceed, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Objects(usize),
    Bytes(usize),
}

impl Over {
    fn describe(self) -> (String, &'static str) {
        match self {
            Over::Objects(n) => (format!("{n} objects"), MAX_OBJECTS_FLAG),
            Over::Bytes(n) => (format!("{n} bytes"), MAX_BYTES_FLAG),
        }
    }
}

impl Budget {
    /// Count one more object of `bytes`, unless that exceeds a limit.
    pub fn take(&mut self, bytes: usize, limits: &Limits) -> Result<(), Over> {
        if self.objects + 1 > limits.max_objects {
            return Err(Over::Objects(limits.max_objects));
        }
        let total = self.bytes.saturating_add(bytes);
        if total > limits.max_bytes {
            return Err(Over::Bytes(limits.max_bytes));
        }
        self.objects += 1;
        self.bytes = total;
        Ok(())
    }
}

/// The size an object is counted with: its JSON.
pub fn size<K: Serialize>(object: &K) -> usize {
    serde_json::to_vec(object).map_or(0, |v| v.len())
}

/// Why a bounded list failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("listing {call}: {source}")]
    Kube {
        /// What was listed: `Secrets in ns`.
        call: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Exceeded(#[from] Exceeded),
}

/// Every object `params` selects in `namespace`, read [`Limits::page`] at a
/// time, within `limits`: more objects or bytes than they allow is
/// [`Exceeded`], found at the latest on the page that goes over, so at most
/// the limits and one page are ever held.
pub async fn list<K>(
    api: &Api<K>,
    namespace: &str,
    params: &ListParams,
    limits: &Limits,
) -> Result<Vec<K>, ListError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    list_sieved(api, namespace, params, limits, Some).await
}

/// [`list`], keeping only what `sieve` returns: every object counts against
/// [`Limits::max_objects`], only the kept ones against [`Limits::max_bytes`]
/// (the others are dropped with their page).
pub async fn list_sieved<K>(
    api: &Api<K>,
    namespace: &str,
    params: &ListParams,
    limits: &Limits,
    mut sieve: impl FnMut(K) -> Option<K>,
) -> Result<Vec<K>, ListError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let mut budget = Budget::default();
    let mut kept = Vec::new();
    let mut params = params.clone().limit(limits.page.max(1));
    loop {
        let page = api.list(&params).await.map_err(|source| ListError::Kube {
            call: format!("listing {}s in {namespace}", K::kind(&())),
            source,
        })?;
        for object in page.items {
            let object = sieve(object);
            let bytes = object.as_ref().map_or(0, size);
            if let Err(over) = budget.take(bytes, limits) {
                let (limit, flag) = over.describe();
                return Err(Exceeded {
                    kind: K::kind(&()).to_string(),
                    namespace: namespace.to_string(),
                    selector: params.label_selector.clone().unwrap_or_default(),
                    limit,
                    flag,
                }
                .into());
            }
            kept.extend(object);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_objects: usize, max_bytes: usize) -> Limits {
        Limits {
            max_objects,
            max_bytes,
            ..Limits::default()
        }
    }

    #[test]
    fn a_budget_takes_objects_up_to_each_limit_and_not_one_more() {
        let l = limits(3, 100);
        let mut b = Budget::default();
        assert_eq!(b.take(40, &l), Ok(()));
        assert_eq!(b.take(60, &l), Ok(()));
        // Exactly at the byte limit; one byte more is refused and not counted.
        assert_eq!(b.take(1, &l), Err(Over::Bytes(100)));
        assert_eq!(
            b,
            Budget {
                objects: 2,
                bytes: 100
            }
        );
        assert_eq!(b.take(0, &l), Ok(()));
        assert_eq!(b.take(0, &l), Err(Over::Objects(3)));
        // A huge object cannot wrap the count around.
        let mut b = Budget::default();
        assert_eq!(b.take(usize::MAX, &l), Err(Over::Bytes(100)));
        assert_eq!(b, Budget::default());
    }

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("262144"), Ok(262144));
        assert_eq!(parse_bytes("256Ki"), Ok(256 << 10));
        assert_eq!(parse_bytes("32Mi"), Ok(32 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        for bad in [
            "",
            "0",
            "-1",
            "1K",
            "1 Mi",
            "Mi",
            "1.5Mi",
            "99999999999999999999Gi",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_exceeded_list_names_what_and_the_flag_to_change() {
        let (limit, flag) = Over::Bytes(1024).describe();
        let e = Exceeded {
            kind: "Secret".into(),
            namespace: "tenant".into(),
            selector: "kubeonkube.io/cluster=c".into(),
            limit,
            flag,
        };
        let text = e.to_string();
        assert!(
            text.starts_with(
                "Secrets labelled kubeonkube.io/cluster=c in namespace tenant hold more than 1024 bytes (the operator's --max-listed-bytes)"
            ),
            "{text}"
        );
        assert_eq!(Over::Objects(5).describe().1, MAX_OBJECTS_FLAG);
    }

    #[test]
    fn the_defaults_are_the_flags_defaults() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            limits: LimitArgs,
        }
        let cli = Cli::try_parse_from(["x"]).expect("defaults");
        assert_eq!(cli.limits.limits(), Limits::default());
    }
}
