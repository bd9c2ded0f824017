//! Names that become paths on a host (package names, versions, paths inside
//! a version directory) are checked here before any script uses them, even
//! though the CRDs check them too: a status is written by whoever may patch
//! it, and a CRD may be installed from an older release.

use kube_on_kube_api::package::PackageVersionSpec;

use crate::Error;

/// Why `name` cannot be a package name (a lowercase DNS label): the name is
/// a directory under the packages root, and a lock file beside it.
pub fn package_name(name: &str) -> Result<(), &'static str> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err("not a package name (a lowercase DNS label)")
    }
}

/// Why `version` cannot name a version directory.
pub fn version(version: &str) -> Result<(), &'static str> {
    let ok = !version.is_empty()
        && version.len() <= 64
        && version.starts_with(|c: char| c.is_ascii_digit())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+-_".contains(c));
    if ok {
        Ok(())
    } else {
        Err("not a version (digits first, then letters, digits, . + - _)")
    }
}

/// Why `path` is not a path that stays inside the directory it is relative
/// to: absolute, empty, with a `.` or `..` segment, or with control
/// characters.
pub fn relative(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty");
    }
    if path.starts_with('/') {
        return Err("absolute");
    }
    if path.chars().any(char::is_control) {
        return Err("contains control characters");
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return Err("has a . or .. segment");
    }
    Ok(())
}

/// Why `path` cannot be an absolute path on a host (links, files).
pub fn absolute(path: &str) -> Result<(), &'static str> {
    if !path.starts_with('/') || path.len() < 2 {
        return Err("not an absolute path");
    }
    if path.chars().any(char::is_control) {
        return Err("contains control characters");
    }
    if path.split('/').any(|s| s == "..") {
        return Err("has a .. segment");
    }
    Ok(())
}

fn unsafe_path(what: String, path: &str, reason: &'static str) -> Error {
    Error::UnsafePath {
        what,
        path: path.to_string(),
        reason,
    }
}

/// Every name of `spec` that becomes a path on the host, checked.
pub fn check_spec(spec: &PackageVersionSpec) -> Result<(), Error> {
    package_name(&spec.package).map_err(|r| unsafe_path("package".into(), &spec.package, r))?;
    version(&spec.version).map_err(|r| unsafe_path("version".into(), &spec.version, r))?;
    for (i, b) in spec.install.binaries.iter().enumerate() {
        relative(&b.path)
            .map_err(|r| unsafe_path(format!("install.binaries[{i}].path"), &b.path, r))?;
        if let Some(link) = &b.link {
            absolute(link)
                .map_err(|r| unsafe_path(format!("install.binaries[{i}].link"), link, r))?;
        }
    }
    for (i, f) in spec.install.files.iter().enumerate() {
        absolute(&f.path)
            .map_err(|r| unsafe_path(format!("install.files[{i}].path"), &f.path, r))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_are_dns_labels() {
        assert!(package_name("kubelet").is_ok());
        assert!(package_name("cni-plugins").is_ok());
        for bad in ["", "../../etc", "a/b", "-a", "A", ".", "..", "a\n", "a b"] {
            assert!(package_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn versions_cannot_leave_the_package_directory() {
        assert!(version("1.35.4").is_ok());
        assert!(version("2.1.4-rc.1+build_7").is_ok());
        for bad in ["", "..", "../1", "1/../..", "1.0\n", ".1", "1 2"] {
            assert!(version(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relative_paths_stay_inside() {
        assert!(relative("bin/kubelet").is_ok());
        assert!(relative("kubelet").is_ok());
        assert!(relative("a..b/c").is_ok());
        for bad in [
            "",
            "/usr/bin/x",
            "../evil",
            "bin/../../evil",
            "bin/..",
            "./x",
            "bin/x\n",
            "bin/\u{7f}",
        ] {
            assert!(relative(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn absolute_paths_have_no_parent_segments() {
        assert!(absolute("/usr/local/bin/kubelet").is_ok());
        for bad in ["", "/", "usr/bin", "/usr/../etc/x", "/a\nb"] {
            assert!(absolute(bad).is_err(), "{bad:?}");
        }
    }
}
