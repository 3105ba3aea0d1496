import Foundation
import Testing
import Varlink

/// One example of README.md's "First login": the fenced blocks after a
/// `<!-- example: NAME -->` line, up to the next such line or heading.
struct ReadmeExample {
    var name: String
    /// Its `ini` blocks: configuration.
    var configuration: [String] = []
    /// Its `sh` blocks: scripts, run in order.
    var scripts: [String] = []

    /// The examples of the section `heading` of README.md, in order.
    static func load(section heading: String = "## First login") throws -> [ReadmeExample] {
        let path = Binaries.packageRoot.appendingPathComponent("README.md").path
        let lines = try String(contentsOfFile: path, encoding: .utf8).split(
            separator: "\n", omittingEmptySubsequences: false)
        guard let start = lines.firstIndex(where: { $0 == heading }) else {
            throw HarnessError("README.md has no \(heading)")
        }
        var examples: [ReadmeExample] = []
        var block: (language: String, lines: [Substring])?
        for line in lines[(start + 1)...] {
            if var open = block {
                if line == "```" {
                    let text = open.lines.joined(separator: "\n") + "\n"
                    if open.language == "ini" { examples[examples.count - 1].configuration.append(text) }
                    if open.language == "sh" { examples[examples.count - 1].scripts.append(text) }
                    block = nil
                } else {
                    open.lines.append(line)
                    block = open
                }
            } else if line.hasPrefix("## ") {
                break
            } else if line.hasPrefix("<!-- example: ") {
                let name = line.dropFirst("<!-- example: ".count).prefix { $0 != " " }
                examples.append(ReadmeExample(name: String(name)))
            } else if line.hasPrefix("```"), !examples.isEmpty {
                block = (String(line.dropFirst(3)), [])
            }
        }
        return examples
    }
}

/// README.md's "First login" examples run as written (issue 32: "the
/// README's examples are the ones the tests run"): their configuration
/// goes to a real vaultd, their commands run in `sh` with the built
/// vaultctl, and the real Authlib server stands in for the identity
/// provider and for Salesforce, whose origins (and the key file's
/// directory) are the only text replaced. The test plays the person: a
/// stand-in `xdg-open` is the browser that signs alice in, and the device
/// flow's code is approved for bob as the script shows it.
@Suite(
    "README's first-login examples, run as written", .requiresKeyring, .requiresAuthlib, .ownThreads,
    .timeLimit(.minutes(3)))
struct FirstLoginExamplesTests {
    /// README's client of `[Provider example]`, with a secret it stores.
    static let example = AuthlibServer.Registration(
        id: "vaultd-example", secret: "example-client-secret-4821", method: "client_secret_basic")
    /// README's Salesforce connected app: the consumer key, the key's public half.
    static let salesforceConsumerKey = "3MVG9PLACEHOLDER_CONSUMER_KEY"
    /// The key file README names, replaced by the test's own.
    static let readmeKeyFile = "/home/alice/.config/vaultd/salesforce.key"

    /// `text` with the examples' hosts and key file replaced by the test's.
    static func localized(_ text: String, server: AuthlibServer, keyFile: String) -> String {
        text.replacingOccurrences(of: "https://idp.example.com", with: server.url)
            .replacingOccurrences(of: "https://login.salesforce.com", with: server.url)
            .replacingOccurrences(of: readmeKeyFile, with: keyFile)
    }

    /// Runs `script` in `sh -e` with `input` on stdin, the built vaultctl and
    /// `bin` first on PATH, vaultd's socket in `VAULTD_SOCKET`; `during` sees
    /// its output while it runs.
    static func run(
        _ script: String, input: String = "", bin: String, socket: String,
        during: (OutputCollector) throws -> Void = { _ in }
    ) throws -> (status: Int32, stdout: String, stderr: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-ec", script]
        process.environment = [
            "PATH": "\(bin):\(Binaries.directory.path):/usr/bin:/bin", "VAULTD_SOCKET": socket,
            "HOME": ProcessInfo.processInfo.environment["HOME"] ?? "/root", "LANG": "C.UTF-8",
        ]
        let stdin = Pipe()
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        let out = OutputCollector(stdout)
        let err = OutputCollector(stderr)
        try process.run()
        feed(stdin.fileHandleForWriting, input)
        try? stdin.fileHandleForWriting.close()
        do { try during(out) } catch {
            kill(process.processIdentifier, SIGKILL)
            _ = try? reap(process)
            throw error
        }
        let status = try reap(process, seconds: 60)
        _ = out.waitForEnd()
        _ = err.waitForEnd()
        return (status, out.text, err.text)
    }

    @Test("Should run every first-login example of README.md as written, against a real vaultd and Authlib")
    func examples() throws {
        let examples = try ReadmeExample.load()
        #expect(
            examples.map(\.name) == ["demo", "oauth2", "salesforce"], "README's examples changed: update this test")
        let directory = try TemporaryDirectory()
        let key = try TestKeyPair("RSA", in: directory, name: "salesforce")
        let salesforce = AuthlibServer.Registration(
            id: Self.salesforceConsumerKey, secret: nil, method: "none", publicKey: (key.publicKey, key.type),
            jwtBearer: true)
        let server = try AuthlibServer(
            directory: directory, extra: [Self.example, salesforce], arguments: ["--device-interval", "1"])
        // The browser: what xdg-open starts, following the sign-in's redirect to vaultctl.
        let bin = directory.path("bin")
        try FileManager.default.createDirectory(atPath: bin, withIntermediateDirectories: true)
        try "#!/bin/sh\ncurl -fsSL --max-time 30 -o /dev/null \"$1\" &\n".write(
            toFile: bin + "/xdg-open", atomically: true, encoding: .utf8)
        #expect(chmod(bin + "/xdg-open", 0o755) == 0)

        let configuration = examples.flatMap(\.configuration).joined(separator: "\n")
        let fixture = try DaemonFixture(
            config: "[Provider demo]\nType=static\n\n"
                + Self.localized(configuration, server: server, keyFile: key.privateKey))
        var outputs: [String] = []

        let demo = try #require(examples.first { $0.name == "demo" })
        for script in demo.scripts {
            let run = try Self.run(script, bin: bin, socket: fixture.socketPath)
            #expect(run.status == 0, "demo: \(run.stderr)")
            #expect(run.stdout.contains("my-token-value-1234567890"), "vaultctl token printed the token: \(run.stdout)")
            outputs += [run.stdout, run.stderr]
        }

        let oauth2 = try #require(examples.first { $0.name == "oauth2" })
        // Who signs in at the authorization endpoint: alice, in the browser.
        try server.approve(as: "alice")
        for script in oauth2.scripts {
            let run = try Self.run(
                Self.localized(script, server: server, keyFile: key.privateKey), input: Self.example.secret ?? "",
                bin: bin, socket: fixture.socketPath
            ) { output in
                // bob, at another device, enters the code shown.
                guard output.wait(for: "Ctrl-C cancels", seconds: 60) else { return }
                let lines = output.text.split(separator: "\n").map(String.init)
                let code = try #require(lines.firstIndex(of: "and enter the code:").map { lines[$0 + 1] })
                try server.device("approve", code, user: "bob")
            }
            #expect(run.status == 0, "oauth2: \(run.stdout) \(run.stderr)")
            let printed = run.stdout.split(separator: "\n").last.map(String.init) ?? ""
            #expect(try server.user(of: printed) == "alice", "the script's last line is alice's token")
            outputs += [run.stdout, run.stderr]
        }
        for (user, identity) in [("alice", "alice"), ("bob", "bob"), ("build-bot", Self.example.id)] {
            let token = try vaultctl(fixture.socketPath, ["token", "example", user]).stdout
            #expect(try server.user(of: token.trimmingCharacters(in: .whitespacesAndNewlines)) == identity, "\(user)")
        }

        let sf = try #require(examples.first { $0.name == "salesforce" })
        for script in sf.scripts {
            let run = try Self.run(
                Self.localized(script, server: server, keyFile: key.privateKey), bin: bin, socket: fixture.socketPath)
            #expect(run.status == 0, "salesforce: \(run.stderr)")
            // The REST API root at the instance URL, reached with the token: whose it is.
            #expect(run.stdout.contains("\"user\": \"alice@example.com\""), "\(run.stdout)")
            outputs += [run.stdout, run.stderr]
        }

        let secrets = [Self.example.secret ?? ""] + (try key.privateLines())
        for text in outputs + [fixture.daemon?.output.text ?? ""] {
            for secret in secrets { #expect(!text.contains(secret), "a secret in the output") }
        }
    }
}
