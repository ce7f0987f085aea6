//! The methods MCP defines for a client to send (SPEC section 15). The backend keeps one
//! session for every client, so a method the proxy does not know could keep state that
//! one client sets and another reads: such a request is answered by the proxy, and such a
//! notification dropped, unless the operator passes it (`--pass-method`).

/// Requests a 2025-era client may send (2024-11-05 to 2025-11-25).
const REQUESTS: [&str; 17] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/result",
    "tasks/list",
    "tasks/cancel",
];

/// Requests only a 2026-07-28 client sends (those the revision removed are refused by
/// SPEC section 13's checks before this one).
const MODERN_REQUESTS: [&str; 2] = ["server/discover", "subscriptions/listen"];

/// Client notifications the proxy handles itself (an `initialize` sent without an id is
/// absorbed by the router, as `notifications/initialized` is).
const NOTIFICATIONS: [&str; 3] = [
    "notifications/cancelled",
    "notifications/initialized",
    "initialize",
];

/// Other methods MCP names, which a label may carry: the server's requests and the
/// client's notifications the proxy forwards or answers.
const OTHERS: [&str; 5] = [
    "sampling/createMessage",
    "elicitation/create",
    "roots/list",
    "notifications/progress",
    "notifications/roots/list_changed",
];

/// `method` as one of the names MCP defines, for a bounded label.
pub(crate) fn named(method: &str) -> Option<&'static str> {
    (REQUESTS.iter().chain(&MODERN_REQUESTS))
        .chain(&NOTIFICATIONS[..2])
        .chain(&OTHERS)
        .find(|m| **m == method)
        .copied()
}

/// Whether a client request of `method` is one of MCP's, in its era.
pub(crate) fn is_request(method: &str, modern: bool) -> bool {
    REQUESTS.contains(&method) || (modern && MODERN_REQUESTS.contains(&method))
}

/// Whether a client notification of `method` is one the proxy takes.
pub(crate) fn is_notification(method: &str) -> bool {
    NOTIFICATIONS.contains(&method)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mcps_methods_are_known() {
        assert!(is_request("tools/call", false) && is_request("tasks/cancel", true));
        assert!(!is_request("server/discover", false) && is_request("server/discover", true));
        for unknown in [
            "foo/bar",
            "Tools/call",
            "tools/call ",
            "",
            "notifications/cancelled",
        ] {
            assert!(!is_request(unknown, true), "{unknown}");
        }
        assert!(is_notification("notifications/cancelled"));
        assert!(!is_notification("notifications/roots/list_changed"));
        assert_eq!(named("tasks/get"), Some("tasks/get"));
        assert_eq!(
            named("notifications/initialized"),
            Some("notifications/initialized")
        );
        assert_eq!(named("initialize"), Some("initialize"));
        assert_eq!(named("foo/bar"), None);
    }
}
