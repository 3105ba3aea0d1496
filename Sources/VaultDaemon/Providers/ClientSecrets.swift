import VaultCore
import VaultSystem

/// Client secrets come from files (systemd credentials), never the config text.
enum ClientSecrets {
    static func read(_ settings: OAuth2Settings, log: Logger) -> Secret? {
        guard var path = settings.clientSecretFile else { return nil }
        if !path.hasPrefix("/"), let credentials = Environment.get("CREDENTIALS_DIRECTORY") {
            path = credentials + "/" + path
        }
        guard var bytes = try? Files.read(path, limit: 64 * 1024),
            let text = String(validating: bytes, as: UTF8.self)
        else {
            log.error("the client secret file cannot be read", ["path": path])
            return nil
        }
        bytes.withUnsafeMutableBytes { raw in for i in raw.indices { raw[i] = 0 } }
        return Secret(LoginCredential.trimmed(text))
    }
}
