//! etcd + kube-apiserver (+ controller-manager, scheduler, kwok).
