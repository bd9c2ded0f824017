//! Container images stand for binaries here: no registry or container engine
//! exists, so an image's name picks the locally built program of that name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Image name → program. A name may carry a tag (`etcd:3.6.15-0`) to map one
/// release of an image to its own program, so upgrades between two real
/// releases can be run; an untagged name maps every other tag.
#[derive(Debug, Clone, Default)]
pub struct ImageMap {
    programs: BTreeMap<String, PathBuf>,
}

/// The program name an image reference stands for: its last path component
/// without tag or digest (`registry.k8s.io/etcd:3.6.16-0` → `etcd`).
pub fn program_name(image: &str) -> &str {
    let tagged = tagged_name(image);
    tagged.split(':').next().unwrap_or(tagged)
}

/// The last path component with its tag, without digest
/// (`registry.k8s.io/etcd:3.6.16-0` → `etcd:3.6.16-0`).
pub fn tagged_name(image: &str) -> &str {
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split('@').next().unwrap_or(last)
}

impl ImageMap {
    /// Map `name` (as it appears in images and commands) to `program`.
    pub fn insert(&mut self, name: &str, program: PathBuf) {
        self.programs.insert(name.to_string(), program);
    }

    /// The program an image runs, if one is known: the one mapped to its
    /// name and tag, else the one mapped to its name.
    pub fn program(&self, image: &str) -> Option<&Path> {
        self.programs
            .get(tagged_name(image))
            .or_else(|| self.programs.get(program_name(image)))
            .map(PathBuf::as_path)
    }

    /// Like [`ImageMap::resolve_argv0`], but a command naming the image's own
    /// program runs the release mapped to the image's tag, if one is.
    pub fn resolve_argv0_for(&self, image: &str, argv: &mut [String]) {
        if let Some(first) = argv.first_mut() {
            let base = first.rsplit('/').next().unwrap_or(first);
            if base == program_name(image)
                && let Some(program) = self.programs.get(tagged_name(image))
            {
                *first = program.display().to_string();
                return;
            }
        }
        self.resolve_argv0(argv);
    }

    /// Rewrite `argv[0]` when it names a known program by name or by a path
    /// inside the image (`/usr/local/bin/etcd`); otherwise leave it.
    pub fn resolve_argv0(&self, argv: &mut [String]) {
        if let Some(first) = argv.first_mut() {
            let base = first.rsplit('/').next().unwrap_or(first).to_string();
            if let Some(program) = self.programs.get(&base) {
                *first = program.display().to_string();
            }
        }
    }

    /// Names of every mapped program, for error messages.
    pub fn known(&self) -> Vec<&str> {
        self.programs.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_name_programs() {
        assert_eq!(program_name("registry.k8s.io/etcd:3.6.16-0"), "etcd");
        assert_eq!(program_name("kube-apiserver"), "kube-apiserver");
        assert_eq!(
            program_name("ghcr.io/kube-on-kube/node-operator@sha256:abc"),
            "node-operator"
        );
        assert_eq!(
            program_name("localhost:5000/kube-scheduler:v1.35.4"),
            "kube-scheduler"
        );
    }

    #[test]
    fn commands_by_path_are_resolved() {
        let mut map = ImageMap::default();
        map.insert("etcd", PathBuf::from("/cache/bin/etcd"));
        let mut argv = vec!["/usr/local/bin/etcd".to_string(), "--name=x".to_string()];
        map.resolve_argv0(&mut argv);
        assert_eq!(argv[0], "/cache/bin/etcd");
        let mut other = vec!["sh".to_string()];
        map.resolve_argv0(&mut other);
        assert_eq!(other[0], "sh");
        assert_eq!(
            map.program("registry.k8s.io/etcd:3.6.16-0"),
            Some(Path::new("/cache/bin/etcd"))
        );
        assert_eq!(map.program("nginx"), None);
    }

    #[test]
    fn a_tagged_mapping_picks_one_release() {
        let mut map = ImageMap::default();
        map.insert("etcd", PathBuf::from("/bin/etcd"));
        map.insert("etcd:3.6.15-0", PathBuf::from("/bin/etcd-v3.6.15"));
        let old = "registry.k8s.io/etcd:3.6.15-0";
        let new = "registry.k8s.io/etcd:3.6.16-0";
        assert_eq!(tagged_name(old), "etcd:3.6.15-0");
        assert_eq!(map.program(old), Some(Path::new("/bin/etcd-v3.6.15")));
        assert_eq!(map.program(new), Some(Path::new("/bin/etcd")));
        let mut argv = vec!["etcd".to_string(), "--name=x".to_string()];
        map.resolve_argv0_for(old, &mut argv);
        assert_eq!(argv[0], "/bin/etcd-v3.6.15");
        let mut argv = vec!["etcd".to_string()];
        map.resolve_argv0_for(new, &mut argv);
        assert_eq!(argv[0], "/bin/etcd");
        // A command naming another program is not the image's release.
        let mut argv = vec!["etcdctl".to_string()];
        map.insert("etcdctl", PathBuf::from("/bin/etcdctl"));
        map.resolve_argv0_for(old, &mut argv);
        assert_eq!(argv[0], "/bin/etcdctl");
    }
}
