import Foundation
import Testing

/// The static vaultctl under test, from `VAULTD_STATIC_VAULTCTL`.
private let staticVaultctl: URL? = ProcessInfo.processInfo.environment["VAULTD_STATIC_VAULTCTL"].map {
    URL(fileURLWithPath: $0)
}

/// The installable vaultctl (`vaultctl_release_binary` in scripts/lib/build.sh)
/// is a fully static executable and works end to end against a real vaultd
/// and gnome-keyring. Building it takes minutes, so `scripts/test --soak`
/// builds it and names it in `VAULTD_STATIC_VAULTCTL`; without that variable
/// the suite is skipped.
@Suite(
    "Static vaultctl", .ownThreads, .timeLimit(.minutes(5)), .requiresKeyring,
    .enabled(
        if: staticVaultctl != nil,
        "VAULTD_STATIC_VAULTCTL is not set: scripts/test --soak builds the static vaultctl and sets it"))
struct StaticVaultctlTests {
    static var binary: URL? { staticVaultctl }

    /// The ELF program header types of the file at `path` (64-bit little-endian only).
    static func programHeaderTypes(_ path: String) throws -> [UInt32] {
        let data = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        func read<T: FixedWidthInteger>(_ offset: Int, _: T.Type) -> T {
            var value: T = 0
            for i in 0..<MemoryLayout<T>.size { value |= T(data[offset + i]) << (8 * i) }
            return value
        }
        guard data.count > 64, data[0..<4] == [0x7f, 0x45, 0x4c, 0x46], data[4] == 2, data[5] == 1 else {
            throw HarnessError("\(path) is not a 64-bit little-endian ELF file")
        }
        let offset = Int(read(32, UInt64.self))
        let size = Int(read(54, UInt16.self))
        let count = Int(read(56, UInt16.self))
        guard size >= 4, count < 256, offset + size * count <= data.count else {
            throw HarnessError("\(path): program headers out of bounds")
        }
        return (0..<count).map { read(offset + $0 * size, UInt32.self) }
    }

    @Test("Should be a static executable: no program interpreter, no dynamic section, ldd agrees")
    func isStatic() throws {
        let path = try #require(Self.binary).path
        let types = try Self.programHeaderTypes(path)
        #expect(types.contains(1), "no PT_LOAD in \(path): \(types)")
        #expect(!types.contains(3), "\(path) names a program interpreter (PT_INTERP): it is dynamically linked")
        #expect(!types.contains(2), "\(path) has a dynamic section (PT_DYNAMIC)")
        let ldd = try runCommand(URL(fileURLWithPath: "/usr/bin/ldd"), [path])
        #expect((ldd.stdout + ldd.stderr).contains("not a dynamic executable"), "ldd: \(ldd.stdout)\(ldd.stderr)")
    }

    @Test("Should log in, list, print the token and log out against a real vaultd, and resolve --owner without NSS")
    func endToEnd() throws {
        let binary = try #require(Self.binary)
        let fixture = try DaemonFixture()
        let user = uniqueName("static")
        let token = "tok_static_vaultctl_8f3k2m9q4w7e"
        func ctl(_ arguments: [String], input: String? = nil) throws -> CommandResult {
            try runCommand(binary, ["--socket", fixture.socketPath] + arguments, input: input)
        }
        let login = try ctl(["login", "demo", user], input: token)
        #expect(login.status == 0, "\(login.stderr)")
        let printed = try ctl(["token", "demo", user])
        #expect(printed.status == 0, "\(printed.stderr)")
        #expect(printed.stdout.trimmingCharacters(in: .newlines) == token)
        let list = try ctl(["--json", "list"])
        #expect(list.status == 0 && list.stdout.contains(user), "\(list.stdout)\(list.stderr)")
        // --owner by name: this user's own name, read from /etc/passwd (no NSS module).
        let me = try #require(String(validatingCString: getpwuid(geteuid()).pointee.pw_name))
        let owned = try ctl(["--owner", me, "token", "demo", user])
        #expect(owned.status == 0 && owned.stdout.contains(token), "\(owned.stderr)")
        let unknown = try ctl(["--owner", "no-such-user-static", "list"])
        #expect(unknown.status == 2 && unknown.stderr.contains("no user 'no-such-user-static'"), "\(unknown.stderr)")
        let logout = try ctl(["logout", "demo", user])
        #expect(logout.status == 0, "\(logout.stderr)")
        let gone = try ctl(["token", "demo", user])
        #expect(gone.status == 1, "\(gone.stdout)\(gone.stderr)")
    }
}
