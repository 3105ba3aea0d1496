// swift-tools-version:6.0
import PackageDescription

/// Targets show the layers: C glue at the bottom, a pure domain, the wire
/// protocol, the I/O edges, and thin executables on top.
let package = Package(
    name: "vaultd",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "vaultd", targets: ["vaultd"]),
        .executable(name: "vaultctl", targets: ["vaultctl"]),
        // The Swift client library: typed calls of io.vaultd.Vault and its event stream.
        .library(name: "VaultClient", targets: ["VaultClient"]),
    ],
    targets: [
        // C glue only.
        .systemLibrary(
            name: "CSecret",
            pkgConfig: "libsecret-1",
            providers: [.apt(["libsecret-1-dev"])]
        ),
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        // The SQLite engine of the session store (`[Vault] Store=sqlite`).
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        // The AEAD that seals the SQLite engine's rows (XChaCha20-Poly1305).
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"])]
        ),
        // JWT signatures (RS256, ES256) of the JWT bearer grant and private_key_jwt.
        .systemLibrary(
            name: "CCrypto",
            pkgConfig: "libcrypto",
            providers: [.apt(["libssl-dev"])]
        ),
        .target(name: "CShim"),
        // An HTTP client on libcurl, loaded with dlopen on first use.
        .target(name: "CHTTP", linkerSettings: [.linkedLibrary("dl")]),
        // A free() that zeroes every heap block it releases; vaultd's executable only.
        .target(name: "CWipeOnFree"),

        // Varlink itself, of no service in particular: JSON, NUL framing, calls,
        // replies and org.varlink.service errors, interfaces as data, the peer's
        // credentials, serving limits and a deadline heap. No C, no vault.
        .target(name: "Varlink"),
        // The domain: accounts, sessions, states, errors, config. No C, no I/O.
        .target(name: "VaultCore", dependencies: ["Varlink"]),
        // io.vaultd.Vault on Varlink: its interface as data, its messages, its
        // error replies, the socket path. No C.
        .target(name: "VaultProtocol", dependencies: ["Varlink", "VaultCore"]),
        // Typed system-call helpers shared by the client and the daemon.
        .target(name: "VaultSystem", dependencies: ["CShim"]),
        // A generic Varlink server: framing, connections, a method table, streams,
        // limits, peer credentials, drain; it knows nothing of what it serves.
        .target(name: "VarlinkServer", dependencies: ["Varlink", "VaultSystem", "CShim"]),
        // A blocking Varlink client over a Unix socket with typed calls of
        // io.vaultd.Vault (vaultctl, tests, and Swift programs through the library product).
        .target(name: "VaultClient", dependencies: ["Varlink", "VaultProtocol", "VaultSystem"]),
        // vaultctl's commands, as a library so tests can drive them.
        .target(name: "VaultCLI", dependencies: ["VaultClient"]),
        // The I/O edges: secret store, socket server, config files, wiring.
        .target(
            name: "VaultDaemon",
            dependencies: [
                "Varlink", "VaultCore", "VaultProtocol", "VaultSystem", "VarlinkServer", "CSecret", "CSystemd", "CShim",
                "CHTTP",
                "CSQLite", "CSodium", "CCrypto",
            ]),

        // The fleet's shared store (`Store=etcd`): the etcd client, its watch and
        // locks, and EtcdStore. It plugs into the daemon through
        // `SharedSessionStore`; the daemon knows nothing of etcd.
        .target(
            name: "VaultFleet",
            dependencies: ["Varlink", "VaultCore", "VaultSystem", "VaultDaemon", "CHTTP"]),

        .executableTarget(name: "vaultd", dependencies: ["VaultDaemon", "VaultFleet", "CWipeOnFree"]),
        .executableTarget(name: "vaultctl", dependencies: ["VaultCLI"]),

        // Test process only: keeps Foundation's Process.run() from faulting (see its source).
        .target(name: "CProcessSpawnFix", path: "Tests/Support/CProcessSpawnFix"),

        .testTarget(name: "VaultCoreTests", dependencies: ["Varlink", "VaultCore"]),
        .testTarget(name: "VaultProtocolTests", dependencies: ["Varlink", "VaultProtocol"]),
        // The transport alone, serving a toy interface: no vault, no processes.
        .testTarget(
            name: "VarlinkServerTests", dependencies: ["VarlinkServer", "Varlink", "VaultSystem"]),
        // vaultctl in-process: parsing, help, usage errors, completion scripts; no daemon.
        .testTarget(name: "VaultCLITests", dependencies: ["VaultCLI", "Varlink", "CProcessSpawnFix"]),
        // The session manager without processes: fakes, a manual clock, the simulation.
        .testTarget(name: "VaultDaemonTests", dependencies: ["VaultDaemon", "Varlink", "VaultCore", "VaultProtocol"]),
        .testTarget(
            name: "VaultIntegrationTests",
            dependencies: [
                "VaultClient", "Varlink", "VaultProtocol", "VaultSystem", "VaultDaemon", "VaultFleet",
                "CProcessSpawnFix",
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
