//! Azure's rules for the names and values that `LoadBalancerSettings` carries, shared by the
//! writers (the watcher refuses a Service that breaks them, out loud) and the state server (which
//! refuses such an update at its edge), so that what reaches a worker is what Azure takes.

/// The longest idle timeout of a rule that Azure's Container Load Balancer takes, in minutes
/// (the shortest, and the default, is 4).
pub const MAX_IDLE_TIMEOUT_MINUTES: u32 = 30;
/// The shortest idle timeout of a rule, in minutes: Azure's default.
pub const MIN_IDLE_TIMEOUT_MINUTES: u32 = 4;

/// The longest Azure resource name (a public IP's).
const MAX_NAME_LEN: usize = 80;
/// The longest Azure resource group name.
const MAX_RESOURCE_GROUP_LEN: usize = 90;

/// Why `label` is not a DNS label Azure takes for a public IP (`dnsSettings.domainNameLabel`:
/// 3 to 63 characters of lower-case letters, digits and hyphens, starting with a letter, ending
/// with a letter or digit), if it is not.
pub fn dns_label_error(label: &str) -> Option<&'static str> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if !(3..=63).contains(&label.len()) {
        Some("must be 3 to 63 characters")
    } else if !label.chars().all(ok_char) {
        Some("may hold only lower-case letters, digits and hyphens")
    } else if !label.starts_with(|c: char| c.is_ascii_lowercase()) {
        Some("must start with a lower-case letter")
    } else if label.ends_with('-') {
        Some("must end with a letter or digit")
    } else {
        None
    }
}

/// Why `name` is not an Azure public IP name (1 to 80 characters of letters, digits, `_`, `.` and
/// `-`, starting with a letter or digit, ending with a letter, digit or `_`), if it is not.
pub fn resource_name_error(name: &str) -> Option<&'static str> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        Some("must be 1 to 80 characters")
    } else if !name.chars().all(ok_char) {
        Some("may hold only letters, digits, '_', '.' and '-'")
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        Some("must start with a letter or digit")
    } else if name.ends_with(['.', '-']) {
        Some("must end with a letter, digit or '_'")
    } else {
        None
    }
}

/// Why `group` is not an Azure resource group name (1 to 90 characters of letters, digits, `_`,
/// `-`, `.`, `(` and `)`, not ending with `.`), if it is not.
pub fn resource_group_error(group: &str) -> Option<&'static str> {
    let ok_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '(' | ')');
    if group.is_empty() || group.len() > MAX_RESOURCE_GROUP_LEN {
        Some("must be 1 to 90 characters")
    } else if !group.chars().all(ok_char) {
        Some("may hold only letters, digits, '_', '-', '.', '(' and ')'")
    } else if group.ends_with('.') {
        Some("must not end with '.'")
    } else {
        None
    }
}
