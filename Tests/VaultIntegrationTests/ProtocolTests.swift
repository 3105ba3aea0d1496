import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

extension VarlinkClient {
    /// A connection for sending what a well-behaved client never would; every
    /// read and write bounded by 10 s.
    static func raw(_ path: String) throws -> VarlinkClient { try VarlinkClient(path: path, timeoutSeconds: 10) }

    /// Sends `text` as it is, with the NUL that ends a message unless `terminated` is false.
    func send(_ text: String, terminated: Bool = true) throws {
        try send(bytes: Array(text.utf8) + (terminated ? [0] : []))
    }
}

/// The Varlink socket under bad and unusual input.
@Suite("Varlink protocol", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ProtocolTests {
    let fixture: DaemonFixture

    init() throws { fixture = try DaemonFixture() }

    @Test("Should answer an unknown method with MethodNotFound and keep the connection")
    func unknownMethod() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        try c.send(#"{"method":"io.vaultd.Vault.Frobnicate","parameters":{}}"#)
        let reply = try #require(try c.nextReply())
        #expect(reply.error == "org.varlink.service.MethodNotFound")
        #expect(reply.parameters["method"]?.stringValue == "io.vaultd.Vault.Frobnicate")
        try c.send(#"{"method":"com.example.Nope.Call"}"#)
        #expect(try c.nextReply()?.error == "org.varlink.service.InterfaceNotFound")
        try c.send(#"{"method":"org.varlink.service.GetInfo"}"#)
        let info = try #require(try c.nextReply())
        #expect(info.error == nil)
        #expect(info.parameters["interfaces"]?.arrayValue?.contains("io.vaultd.Vault") == true)
    }

    @Test("Should answer wrong parameter types with InvalidParameter naming the parameter")
    func wrongTypes() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        try c.send(#"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":42,"user":"u"}}"#)
        let reply = try #require(try c.nextReply())
        #expect(reply.error == "org.varlink.service.InvalidParameter")
        #expect(reply.parameters["parameter"]?.stringValue == "provider")
        try c.send(#"{"method":"io.vaultd.Vault.Login","parameters":{"provider":"demo"}}"#)
        #expect(try c.nextReply()?.parameters["parameter"]?.stringValue == "user")
        try c.send(#"{"parameters":{}}"#)
        #expect(try c.nextReply()?.parameters["parameter"]?.stringValue == "method")
        try c.send(#"{"method":"io.vaultd.Vault.Login","parameters":{"provider":"nope","user":"u","token":"abc"}}"#)
        let unknown = try #require(try c.nextReply())
        #expect(unknown.error == "io.vaultd.Vault.UnknownProvider")
        #expect(unknown.parameters["code"]?.stringValue == "ERR_PROVIDER_NOT_FOUND")
        try c.send(#"{"method":"io.vaultd.Vault.ListSessions"}"#)
        #expect(try c.nextReply()?.error == nil)
    }

    @Test("Should answer invalid JSON with InvalidParameter, then close only that connection")
    func invalidJSONClosesConnection() throws {
        let bystander = try VarlinkClient.raw(fixture.socketPath)
        let c = try VarlinkClient.raw(fixture.socketPath)
        try c.send("{not json")
        try expectMalformedReplyThenEnd(c, saying: "is not JSON")
        try bystander.send(#"{"method":"org.varlink.service.GetInfo"}"#)
        #expect(try bystander.nextReply()?.error == nil)
    }

    @Test("Should answer a message past 1 MiB with InvalidParameter and a clean end of file, never a reset")
    func oversizedMessage() throws {
        // Five times: the reset this guards against came from vaultd closing
        // while the rest of the message was still unread, a matter of timing.
        for _ in 0..<5 {
            let c = try VarlinkClient.raw(fixture.socketPath)
            let chunk = [UInt8](repeating: UInt8(ascii: "a"), count: 64 * 1024)
            // 17 chunks without a NUL: past the cap. vaultd reads (and drops)
            // the rest after its error, so every send goes through.
            for _ in 0..<17 { try c.send(bytes: chunk) }
            try expectMalformedReplyThenEnd(c, saying: "without its NUL terminator")
        }
        let other = try fixture.client().call(ServiceMethod.getInfo.rawValue)
        #expect(other.error == nil)
    }

    @Test("Should close a connection that keeps sending after its malformed message within the linger time")
    func lingerIsBounded() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        try c.send("[1,2")
        let start = Monotonic.milliseconds()
        // Keeps sending what vaultd drops; the send fails once vaultd has closed.
        var sendFailed = false
        for _ in 0..<10_000 where Monotonic.milliseconds() - start < 15_000 {
            if (try? c.send(bytes: [UInt8](repeating: 0x20, count: 4096))) == nil {
                sendFailed = true
                break
            }
            usleep(5_000)  // paces the sender; no synchronisation waits on it
        }
        let elapsed = Monotonic.milliseconds() - start
        #expect(sendFailed, "vaultd still read the connection after \(elapsed) ms")
        #expect(elapsed >= 1_000, "closed after \(elapsed) ms, before the linger time")
        let daemon = try #require(fixture.daemon)
        #expect(daemon.output.wait(for: "connection closed: malformed message past its timeout"))
    }

    /// The last reply of a connection that sent no call: InvalidParameter
    /// saying `problem`, then a clean end of file.
    private func expectMalformedReplyThenEnd(
        _ c: VarlinkClient, saying problem: String, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let reply = Result { try c.nextReply() }
        guard case .success(let answer?) = reply else {
            Issue.record("no error reply: \(reply)", sourceLocation: sourceLocation)
            return
        }
        let error = VaultError(reply: answer)
        #expect(error?.code == .invalidParameter, "\(answer)", sourceLocation: sourceLocation)
        #expect(error?.message.contains(problem) == true, "\(answer)", sourceLocation: sourceLocation)
        let end = Result { try c.nextReply() }
        var clean = false
        if case .success(.none) = end { clean = true }
        #expect(clean, "then a clean end of file: \(end)", sourceLocation: sourceLocation)
    }

    @Test("Should answer pipelined calls in order and send nothing for oneway calls")
    func pipelining() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let calls = [
            #"{"method":"io.vaultd.Vault.GetSession","parameters":{"provider":"demo","user":"p1"}}"#,
            #"{"method":"org.varlink.service.GetInfo","oneway":true}"#,
            #"{"method":"io.vaultd.Vault.Logout","parameters":{"provider":"demo","user":"p2"}}"#,
            #"{"method":"org.varlink.service.GetInterfaceDescription","parameters":{"interface":"io.vaultd.Vault"}}"#,
        ]
        try c.send(bytes: calls.map { Array($0.utf8) + [0] }.flatMap { $0 })
        let first = try #require(try c.nextReply())
        #expect(first.error == "io.vaultd.Vault.NotLoggedIn")
        #expect(first.parameters["message"]?.stringValue?.contains("p1") == true)
        let second = try #require(try c.nextReply())
        #expect(second.error == "io.vaultd.Vault.NotLoggedIn")
        #expect(second.parameters["message"]?.stringValue?.contains("p2") == true)
        let third = try #require(try c.nextReply())
        #expect(third.parameters["description"]?.stringValue == VaultInterface.description)
    }

    @Test("Should serve other clients while one is stuck mid-message or not reading")
    func stuckClientsDoNotDelayOthers() throws {
        let half = try VarlinkClient.raw(fixture.socketPath)
        try half.send(#"{"method":"org.varlink.serv"#, terminated: false)
        // A client that floods calls and never reads its replies.
        let flooder = try VarlinkClient.raw(fixture.socketPath)
        let call = Array(#"{"method":"io.vaultd.Vault.ListSessions"}"#.utf8) + [0]
        var flood: [UInt8] = []
        for _ in 0..<2000 { flood += call }
        let flags = fcntl(flooder.fileDescriptor, F_GETFL)
        _ = fcntl(flooder.fileDescriptor, F_SETFL, flags | O_NONBLOCK)
        for _ in 0..<50 {
            let n = flood.withUnsafeBytes {
                send(flooder.fileDescriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if n < 0 { break }
        }
        for i in 0..<20 {
            let reply = try fixture.client().call(
                VaultMethod.getSession.rawValue, ["provider": "demo", "user": .string("x\(i)")])
            #expect(reply.error == "io.vaultd.Vault.NotLoggedIn")
        }
    }

    @Test("Should work with the independent Python varlink client")
    func pythonClient() throws {
        let script = Binaries.packageRoot.appendingPathComponent("Tests/python/varlink_roundtrip.py")
        let user = uniqueName("py")
        let result = try runCommand(
            URL(fileURLWithPath: "/usr/bin/env"), ["python3", script.path, "unix:" + fixture.socketPath, user],
            seconds: 60)
        #expect(result.status == 0, "\(result.stdout)\n\(result.stderr)")
        #expect(result.stdout.contains("roundtrip ok"))
    }
}
