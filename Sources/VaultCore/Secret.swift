/// A secret value (a token). Printing it, interpolating it or dumping it shows
/// only the masked form, so a secret cannot slip into a log line or an error.
public struct Secret: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    /// The secret itself. Read it only where it must leave the process: the
    /// secret store, a GetToken reply, a provider request.
    public let revealed: String

    /// Wraps a secret value.
    public init(_ value: String) { self.revealed = value }

    /// The masked form, as the seeds print secrets: `inval**********y_xyz`.
    public var masked: String { Secret.mask(revealed) }

    public var description: String { masked }
    public var debugDescription: String { "Secret(\(masked))" }

    /// `dump` and debuggers see the masked form only.
    public var customMirror: Mirror { Mirror(self, children: ["masked": masked]) }

    /// Masks a secret: the first and last five characters around ten stars when
    /// it is long enough for that to hide most of it, else stars only.
    public static func mask(_ value: String) -> String {
        let characters = Array(value)
        guard characters.count >= 20 else { return String(repeating: "*", count: max(characters.count, 4)) }
        return String(characters.prefix(5)) + String(repeating: "*", count: 10) + String(characters.suffix(5))
    }
}
