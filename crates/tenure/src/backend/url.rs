//! The one parser of store URLs, shared by every backend.
//!
//! Server stores: `SCHEME://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT…][/PATH][?OPTION=VALUE&…][#FRAGMENT]`.
//! File stores: `SCHEME://PATH[?OPTION=VALUE&…]` (everything before `?` is the path).
//!
//! The rules are the same for every backend: user and password are
//! percent-decoded (write `@`, `/`, `:`, `?`, `#` in them as `%40`, `%2F`, …),
//! option values are percent-decoded, an option the backend does not list is
//! refused with [`Error::InvalidUrl`] naming it, an option given twice is
//! refused, and the password is masked in every message.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::error::{Error, Result};

/// How a backend reads its URL.
#[derive(Debug, Clone, Copy)]
pub struct UrlRules {
    /// Server (hosts, user info, path) or file (a path) URL.
    pub shape: Shape,
    /// The options this backend takes; any other is refused.
    pub options: &'static [&'static str],
    /// Whether a `#fragment` is passed on to the driver (redis-rs reads
    /// `#insecure`); elsewhere a fragment is refused.
    pub fragment: bool,
}

impl UrlRules {
    /// A server URL taking `options`.
    pub const fn servers(options: &'static [&'static str]) -> UrlRules {
        UrlRules {
            shape: Shape::Servers,
            options,
            fragment: false,
        }
    }

    /// A file URL taking `options`.
    pub const fn file(options: &'static [&'static str]) -> UrlRules {
        UrlRules {
            shape: Shape::File,
            options,
            fragment: false,
        }
    }

    /// These rules, with a `#fragment` passed on to the driver.
    pub const fn with_fragment(self) -> UrlRules {
        UrlRules {
            fragment: true,
            ..self
        }
    }
}

/// See [`UrlRules::shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `SCHEME://[user[:password]@]host:port[,host:port…][/path]`.
    Servers,
    /// `SCHEME://path`: the path is taken as written.
    File,
}

/// A store URL taken apart. The password is never shown: see [`StoreUrl::masked`].
pub struct StoreUrl {
    masked: String,
    scheme: String,
    userinfo: Option<String>,
    user: Option<String>,
    password: Option<String>,
    authority: String,
    path: String,
    options: Vec<UrlOption>,
    fragment: Option<String>,
}

struct UrlOption {
    key: String,
    value: String,
    raw: String,
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.masked).finish()
    }
}

/// Everything but RFC 3986's unreserved characters is encoded in a user
/// name or password handed to a driver.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What to tell a user whose password holds a character that ends the
/// user info (`/`, `?`, `#`) where tenure found an `@` past it.
const ENCODE_HINT: &str = "a user name or password that holds '/', '?', '#' or '@' must be \
     percent-encoded in the URL ('/' as %2F, '?' as %3F, '#' as %23, '@' as %40)";

fn decode(what: &str, s: &str) -> std::result::Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| format!("{what} is not UTF-8 once percent-decoded"))
}

impl StoreUrl {
    /// Parses `url` by `rules`.
    pub fn parse(url: &str, rules: &UrlRules) -> Result<StoreUrl> {
        let masked = mask_password(url);
        let invalid = |reason: String| Error::InvalidUrl {
            url: masked.clone(),
            reason,
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("expected SCHEME://…".into()))?;
        let (rest, fragment) = match (rules.shape, rest.split_once('#')) {
            (Shape::Servers, Some((r, f))) => (r, Some(f.to_string())),
            _ => (rest, None),
        };
        if fragment.as_ref().is_some_and(|f| f.contains('@')) && !rest.contains('@') {
            return Err(invalid(ENCODE_HINT.into()));
        }
        if fragment.is_some() && !rules.fragment {
            return Err(invalid(
                "this backend takes no #fragment (write # in a password as %23)".into(),
            ));
        }
        let (body, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut options: Vec<UrlOption> = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode("an option name", key).map_err(invalid)?;
            if !rules.options.contains(&key.as_str()) {
                let known = if rules.options.is_empty() {
                    "this backend takes no options".to_string()
                } else {
                    format!("known: {}", rules.options.join(", "))
                };
                if key.contains('@') && !body.contains('@') {
                    return Err(invalid(ENCODE_HINT.into()));
                }
                return Err(invalid(format!("unknown option {key:?}; {known}")));
            }
            if options.iter().any(|o| o.key == key) {
                return Err(invalid(format!("option {key:?} is given twice")));
            }
            let value = decode("an option value", value).map_err(invalid)?;
            options.push(UrlOption {
                key,
                value,
                raw: pair.to_string(),
            });
        }
        let (authority, path) = match rules.shape {
            Shape::File => (String::new(), body.to_string()),
            Shape::Servers => match body.find('/') {
                Some(i) => (body[..i].to_string(), body[i..].to_string()),
                None => (body.to_string(), String::new()),
            },
        };
        // `user:pa/ss@host/db` splits at the first '/': no '@' before it,
        // one in the first segment of the path.
        if rules.shape == Shape::Servers
            && !authority.contains('@')
            && path
                .trim_start_matches('/')
                .split('/')
                .next()
                .is_some_and(|first| first.contains('@'))
        {
            return Err(invalid(ENCODE_HINT.into()));
        }
        let (userinfo, authority) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h.to_string()),
            None => (None, authority),
        };
        let (user, password) = match &userinfo {
            Some(u) => {
                let (user, password) = match u.split_once(':') {
                    Some((user, pw)) => (user, Some(pw)),
                    None => (u.as_str(), None),
                };
                let user = decode("the user name", user).map_err(invalid)?;
                let password = password
                    .map(|p| decode("the password", p))
                    .transpose()
                    .map_err(invalid)?;
                (Some(user).filter(|u| !u.is_empty()), password)
            }
            None => (None, None),
        };
        Ok(StoreUrl {
            masked,
            scheme: scheme.to_ascii_lowercase(),
            userinfo,
            user,
            password,
            authority,
            path,
            options,
            fragment,
        })
    }

    /// An [`Error::InvalidUrl`] for this URL, password masked.
    pub fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidUrl {
            url: self.masked.clone(),
            reason: reason.into(),
        }
    }

    /// The URL with its password masked, safe to show.
    pub fn masked(&self) -> &str {
        &self.masked
    }

    /// The scheme, in lower case.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user name, percent-decoded (`None` when absent or empty).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password, percent-decoded.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// `user:password@`, percent-encoded, or `""`: for drivers that take a
    /// URL of their own. Encoded again from the decoded parts, so that an
    /// `@` left unencoded in a password (which tenure reads up to the last
    /// `@`) means the same to every driver.
    pub fn userinfo_encoded(&self) -> String {
        if self.userinfo.is_none() {
            return String::new();
        }
        let user = self.user.as_deref().unwrap_or("");
        let user = utf8_percent_encode(user, USERINFO);
        match &self.password {
            Some(password) => format!("{user}:{}@", utf8_percent_encode(password, USERINFO)),
            None => format!("{user}@"),
        }
    }

    /// What stands between the user info and the path: `host:port[,…]`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The servers, each checked to be `host:port`.
    pub fn servers(&self, what: &str) -> Result<Vec<(String, u16)>> {
        self.authority
            .split(',')
            .map(|server| {
                server
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                    .filter(|(h, _)| !h.is_empty())
                    .map(|(h, p)| (h.to_string(), p))
                    .ok_or_else(|| self.invalid(format!("{what} {server:?} needs host:port")))
            })
            .collect()
    }

    /// The path: from the `/` after the servers on (`""` when none), or the
    /// whole path of a file URL.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The `#fragment`, if the backend takes one.
    pub fn fragment(&self) -> Option<&str> {
        self.fragment.as_deref()
    }

    /// An option's value, percent-decoded.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|o| o.key == key)
            .map(|o| o.value.as_str())
    }

    /// The options not in `ours`, as written, for a driver's own URL:
    /// `?a=1&b=2`, or `""`.
    pub fn driver_query(&self, ours: &[&str]) -> String {
        let rest: Vec<&str> = self
            .options
            .iter()
            .filter(|o| !ours.contains(&o.key.as_str()))
            .map(|o| o.raw.as_str())
            .collect();
        if rest.is_empty() {
            String::new()
        } else {
            format!("?{}", rest.join("&"))
        }
    }
}

/// A URL with its password (if any) replaced by `***`, safe to show: the
/// user-info's, and the value of every query option whose name says it is
/// a secret (`sentinel_password`, `…token`, `…secret`).
pub fn mask_password(url: &str) -> String {
    mask_secret_options(&mask_userinfo(url))
}

/// Whether a query option's value is a secret, by its name.
fn secret_option(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "passwd", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
}

/// The query options that hold secrets, their values replaced by `***`.
fn mask_secret_options(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, format!("#{f}")),
        None => (query, String::new()),
    };
    let options: Vec<String> = query
        .split('&')
        .map(|option| match option.split_once('=') {
            Some((name, _)) if secret_option(name) => format!("{name}=***"),
            _ => option.to_string(),
        })
        .collect();
    format!("{head}?{}{fragment}", options.join("&"))
}

/// The user-info's password replaced by `***`.
fn mask_userinfo(url: &str) -> String {
    // By hand, so that even a URL that does not parse never shows what sits
    // between `user:` and `@`.
    if let Some((scheme, rest)) = url.split_once("://") {
        // The last `@` of all: a password may itself hold `/`, `?`, `#` or
        // `@`, so everything before that `@` after `user:` is hidden (an `@`
        // in a query option hides more than needed, never less).
        if let Some(at) = rest.rfind('@') {
            let userinfo = &rest[..at];
            let tail = &rest[at + 1..];
            let user = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => userinfo.to_string(),
            };
            return format!("{scheme}://{user}@{tail}");
        }
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVERS: UrlRules = UrlRules {
        shape: Shape::Servers,
        options: &["prefix", "tls_ca"],
        fragment: false,
    };

    #[test]
    fn masks_secrets_in_query_options() {
        let shown = mask_password(
            "redis+sentinel://h1:26379/mymaster?sentinel_password=TopSecret1&replicas=abc",
        );
        assert_eq!(
            shown,
            "redis+sentinel://h1:26379/mymaster?sentinel_password=***&replicas=abc"
        );
        assert_eq!(
            mask_password("etcd://h:2379?auth_token=t0k&prefix=a#frag"),
            "etcd://h:2379?auth_token=***&prefix=a#frag"
        );
        assert_eq!(
            mask_password("postgres://h/db?sslmode=require"),
            "postgres://h/db?sslmode=require"
        );
    }

    #[test]
    fn masks_passwords() {
        assert_eq!(
            mask_password("postgres://bob:hunter2@db:5432/app"),
            "postgres://bob:***@db:5432/app"
        );
        assert_eq!(
            mask_password("redis://:s3cret@h:6379/0"),
            "redis://:***@h:6379/0"
        );
        assert_eq!(mask_password("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
        assert!(!mask_password("etcd://u:p@ss@h1:1,h2:2").contains("p@ss"));
        for url in [
            "etcd://u:ab/cd@h:1",
            "redis://:a#b@h:1/0",
            "zk://u:x/y?z@h:1/app",
        ] {
            let masked = mask_password(url);
            assert!(
                !masked.contains("ab/cd") && !masked.contains("a#b") && !masked.contains("x/y"),
                "{masked}"
            );
        }
    }

    /// An '@' left unencoded in a password is read up to the last '@' and
    /// handed on encoded; a '/' or '?' that ends the user info early is
    /// refused with the hint to percent-encode, the password masked.
    #[test]
    fn passwords_with_unencoded_characters() {
        let u = StoreUrl::parse("redis://:p@ss@h:1/0", &SERVERS).unwrap();
        assert_eq!(u.password(), Some("p@ss"));
        assert_eq!(u.userinfo_encoded(), ":p%40ss@");
        assert_eq!(u.authority(), "h:1");
        for url in [
            "redis://:pa/ss@h:1/0",
            "postgres://u:pa/ss@h:1/db",
            "redis://:pa?ss@h:1/0",
            "mysql://u:pa?ss@h:1/db",
            "etcd://u:pa#ss@h:1",
        ] {
            let e = StoreUrl::parse(url, &SERVERS).unwrap_err().to_string();
            assert!(e.contains("must be percent-encoded"), "{url}: {e}");
            assert!(e.contains("'/' as %2F"), "{url}: {e}");
            assert!(!e.contains(":pa"), "{url}: {e}");
            assert!(!e.contains("ss@"), "{url}: {e}");
        }
        // A path of its own with no '@' in it is not taken for a password.
        assert!(StoreUrl::parse("zk://u:pw@h:1/app/x", &SERVERS).is_ok());
    }

    #[test]
    fn takes_servers_apart_and_decodes_user_info() {
        let u = StoreUrl::parse(
            "etcd://al%40ice:p%2Fw%3Ad@h1:1,h2:2/base?prefix=a%20b",
            &SERVERS,
        )
        .unwrap();
        assert_eq!(u.user(), Some("al@ice"));
        assert_eq!(u.password(), Some("p/w:d"));
        assert_eq!(u.userinfo_encoded(), "al%40ice:p%2Fw%3Ad@");
        assert_eq!(
            u.servers("endpoint").unwrap(),
            vec![("h1".into(), 1), ("h2".into(), 2)]
        );
        assert_eq!(u.path(), "/base");
        assert_eq!(u.option("prefix"), Some("a b"));
        assert!(!format!("{u:?}").contains("p%2Fw"));
        assert!(u.servers("x").is_ok());
        let bad = StoreUrl::parse("etcd://h1", &SERVERS).unwrap();
        assert!(bad.servers("endpoint").is_err());
    }

    #[test]
    fn refuses_unknown_and_repeated_options_by_name() {
        let e = StoreUrl::parse("etcd://:pw@h:1?bogus=1", &SERVERS).unwrap_err();
        assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("\"bogus\"") && !text.contains(":pw@"),
            "{text}"
        );
        let e = StoreUrl::parse("etcd://h:1?prefix=a&prefix=b", &SERVERS).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let e = StoreUrl::parse("etcd://h:1#x", &SERVERS).unwrap_err();
        assert!(e.to_string().contains("fragment"), "{e}");
    }

    #[test]
    fn file_urls_keep_the_path_as_written() {
        let rules = UrlRules {
            shape: Shape::File,
            options: &["synchronous"],
            fragment: false,
        };
        let u = StoreUrl::parse("sqlite:///var/a@b#c.db?synchronous=full", &rules).unwrap();
        assert_eq!(u.path(), "/var/a@b#c.db");
        assert_eq!(u.option("synchronous"), Some("full"));
        assert_eq!(u.driver_query(&["synchronous"]), "");
    }
}
