/// What `ReportRejected` did about a token a chat server rejected.
public enum RejectedOutcome: String, Sendable, Equatable {
    /// The reported token was the current one: the session was refreshed
    /// (or the refresh in flight joined), and a new token is served.
    case refreshed
    /// The reported token is not the session's current one any more (a
    /// refresh or a replace came first): nothing was done.
    case alreadyReplaced
    /// The reported token was the current one and the provider cannot
    /// refresh it: the session ended (`tokenInvalid`, reason "rejected").
    case ended
}
