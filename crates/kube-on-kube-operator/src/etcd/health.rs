//! What the etcd step says about etcd in a condition (EtcdReady,
//! EtcdSpread): a leaf, so that the step's parts can say it without
//! importing the step.

/// A condition's status, reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}
