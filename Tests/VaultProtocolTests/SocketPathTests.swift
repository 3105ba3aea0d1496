import Testing
import VaultProtocol

@Suite("SocketPath", .timeLimit(.minutes(5)))
struct SocketPathTests {
    @Test("Should prefer VAULTD_SOCKET over everything")
    func explicit() {
        let env = ["VAULTD_SOCKET": "/tmp/v.sock", "XDG_RUNTIME_DIR": "/run/user/1000"]
        #expect(SocketPath.default(environment: env, uid: 1000) == "/tmp/v.sock")
        #expect(SocketPath.default(environment: env, uid: 0) == "/tmp/v.sock")
    }

    @Test("Should ignore an empty VAULTD_SOCKET")
    func emptyExplicit() {
        #expect(SocketPath.default(environment: ["VAULTD_SOCKET": ""], uid: 1000) == "/run/user/1000/vaultd/socket")
    }

    @Test("Should use XDG_RUNTIME_DIR when set")
    func xdg() {
        let env = ["XDG_RUNTIME_DIR": "/run/user/1000"]
        #expect(SocketPath.default(environment: env, uid: 1000) == "/run/user/1000/vaultd/socket")
        #expect(SocketPath.default(environment: ["XDG_RUNTIME_DIR": "/tmp/rt"], uid: 0) == "/tmp/rt/vaultd/socket")
    }

    @Test("Should use the system socket for root without XDG_RUNTIME_DIR")
    func root() {
        #expect(SocketPath.default(environment: [:], uid: 0) == "/run/vaultd/socket")
        #expect(SocketPath.system == "/run/vaultd/socket")
    }

    @Test("Should use /run/user/UID for another user without XDG_RUNTIME_DIR")
    func user() {
        #expect(SocketPath.default(environment: [:], uid: 1000) == "/run/user/1000/vaultd/socket")
    }

    @Test("Should ignore a relative or empty XDG_RUNTIME_DIR", arguments: ["run/user/1000", "", "."])
    func relativeXDG(value: String) {
        #expect(
            SocketPath.default(environment: ["XDG_RUNTIME_DIR": value], uid: 1000) == "/run/user/1000/vaultd/socket")
        #expect(SocketPath.default(environment: ["XDG_RUNTIME_DIR": value], uid: 0) == "/run/vaultd/socket")
    }
}
