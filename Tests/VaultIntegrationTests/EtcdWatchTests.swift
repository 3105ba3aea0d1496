import Dispatch
import Foundation
import Synchronization
import Testing
import Varlink
import VaultCore

@testable import VaultDaemon
@testable import VaultFleet

/// What a test's watch received, for its assertions.
final class WatchRecorder: Sendable {
    private let state = Mutex<(events: [EtcdWatchEvent], revisions: [Int64], resets: [VaultError])>(([], [], []))

    var events: [EtcdWatchEvent] { state.withLock { $0.events } }
    var revisions: [Int64] { state.withLock { $0.revisions } }
    var resets: [VaultError] { state.withLock { $0.resets } }

    /// A watch of `prefix` on `client` from `revision` that records into this recorder.
    func watch(_ client: EtcdClient, _ prefix: String, from revision: Int64, idle: Double = 30) -> EtcdWatch {
        EtcdWatch(
            client: client, prefix: Array(prefix.utf8), fromRevision: revision, idleTimeoutSeconds: idle,
            onEvents: { events, revision in
                self.state.withLock {
                    $0.events += events
                    $0.revisions.append(revision)
                }
            },
            onReset: { error in self.state.withLock { $0.resets.append(error) } })
    }
}

/// EtcdWatch against a real three-member etcd fleet on loopback: order and
/// revisions of the changes, resuming on another member after the one
/// streaming is killed, compaction, and stopping.
@Suite(
    "etcd watch", .serialized, .ownThreads, .timeLimit(.minutes(5)), .etcdStep)
struct EtcdWatchTests {
    /// A client call's limit where the test waits for an answer rather than asserting a bound.
    static let callTimeout = 20.0

    /// Should deliver puts and deletes under the prefix, in order, with their
    /// revisions and values, and nothing outside the prefix.
    @Test func deliversChangesInOrder() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: Self.callTimeout)
        let start = try await client.put(Array("before".utf8), Array("x".utf8)) + 1
        let recorder = WatchRecorder()
        let watch = recorder.watch(client, "/w/", from: start)
        try watch.start()
        defer { watch.stop() }

        let r1 = try await client.put(Array("/w/a".utf8), Array("one".utf8))
        let r2 = try await client.put(Array("/w/b".utf8), Array("two".utf8))
        try await client.put(Array("/wx".utf8), Array("outside".utf8))
        try await client.delete(Array("/w/a".utf8))
        let r4 = try await client.put(Array("/w/b".utf8), Array("three".utf8))
        let r3 = r4 - 1

        let seen = try await eventually(
            tries: 300, interval: .milliseconds(50), { recorder.events },
            until: {
                $0.count >= 4
            })
        #expect(seen.map(\.kind) == [.put, .put, .delete, .put])
        #expect(seen.map { String(decoding: $0.key, as: UTF8.self) } == ["/w/a", "/w/b", "/w/a", "/w/b"])
        #expect(seen.map { String(decoding: $0.value, as: UTF8.self) } == ["one", "two", "", "three"])
        #expect(seen.map(\.modRevision) == [r1, r2, r3, r4])
        #expect(recorder.revisions.last == r4)
        #expect(watch.deliveredRevision == r4)
        #expect(recorder.resets.isEmpty)
    }

    /// Should, when the member it streams from is killed, resume on another
    /// and deliver a put made meanwhile exactly once, nothing skipped or repeated.
    @Test func resumesOnAnotherMemberExactlyOnce() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: Self.callTimeout)
        let start = try await client.put(Array("/r/0".utf8), Array("0".utf8))
        let recorder = WatchRecorder()
        let watch = recorder.watch(client, "/r/", from: start)
        try watch.start()
        defer { watch.stop() }
        let streaming = try await eventually(
            tries: 300, interval: .milliseconds(50), { watch.connectedEndpoint },
            until: {
                $0 != nil
            })
        let killed = try #require(fleet.endpoints.firstIndex { $0 == streaming })
        try await client.put(Array("/r/1".utf8), Array("1".utf8))
        _ = try await eventually(tries: 300, interval: .milliseconds(50), { recorder.events.count }, until: { $0 >= 2 })

        fleet.kill(killed)
        // Made while the watch has no stream (it reconnects after its backoff).
        let gap = try await client.put(Array("/r/2".utf8), Array("2".utf8))
        // True when the put landed before the watch had its second stream (it
        // usually does: etcd answers it at once unless the killed member led).
        let inGap = watch.streamCount == 1
        let after = try await client.put(Array("/r/3".utf8), Array("3".utf8))

        let seen = try await eventually(
            tries: 400, interval: .milliseconds(50), { recorder.events },
            until: {
                $0.count >= 4
            })
        #expect(seen.map { String(decoding: $0.key, as: UTF8.self) } == ["/r/0", "/r/1", "/r/2", "/r/3"])
        #expect(seen.filter { $0.modRevision == gap }.count == 1)
        #expect(seen.last?.modRevision == after)
        #expect(zip(seen, seen.dropFirst()).allSatisfy { $0.modRevision < $1.modRevision })
        let now = try await eventually(
            tries: 300, interval: .milliseconds(50), { watch.connectedEndpoint },
            until: {
                $0 != nil
            })
        #expect(now != streaming, "the watch streams from the killed member \(streaming ?? "?")")
        // Still following: one more change, still once.
        let last = try await client.put(Array("/r/4".utf8), Array("4".utf8))
        let all = try await eventually(
            tries: 300, interval: .milliseconds(50), { recorder.events },
            until: {
                $0.count >= 5
            })
        #expect(all.count == 5)
        #expect(all.last?.modRevision == last)
        #expect(recorder.resets.isEmpty)
        print("etcd watch: resumed on another member; the put was made before it resumed: \(inGap)")
    }

    /// Should, resuming in the middle of a catch-up longer than etcd sends in
    /// one message (1000 revisions), continue after the last change delivered,
    /// not after the revision the message's header names: nothing skipped.
    @Test func resumesInTheMiddleOfALongCatchUp() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: Self.callTimeout)
        let count = 1200
        let first = try await client.put(Array("/l/0000".utf8), Array("0".utf8))
        try await withThrowingTaskGroup(of: Void.self) { group in
            for lane in 0..<16 {
                group.addTask {
                    for index in stride(from: 1 + lane, to: count, by: 16) {
                        try await client.put(Array("/l/\(index)".utf8), Array("\(index)".utf8))
                    }
                }
            }
            try await group.waitForAll()
        }
        // The first message is held in onEvents until its member is killed.
        let gate = DispatchSemaphore(value: 0)
        let batches = Mutex<[[EtcdWatchEvent]]>([])
        let watch = EtcdWatch(
            client: client, prefix: Array("/l/".utf8), fromRevision: first,
            onEvents: { events, _ in
                let firstBatch = batches.withLock { batches in
                    batches.append(events)
                    return batches.count == 1
                }
                if firstBatch { _ = gate.wait(timeout: .now() + .seconds(30)) }
            }, onReset: { _ in })
        try watch.start()
        defer {
            gate.signal()
            watch.stop()
        }
        _ = try await eventually(
            tries: 400, interval: .milliseconds(20), { batches.withLock { $0.count } }, until: { $0 >= 1 })
        let streaming = try #require(watch.connectedEndpoint)
        let firstCount = batches.withLock { $0.first?.count ?? 0 }
        #expect(firstCount < count, "etcd sent the whole catch-up in one message (\(firstCount) changes)")
        fleet.kill(try #require(fleet.endpoints.firstIndex(of: streaming)))
        gate.signal()

        let all = try await eventually(
            tries: 600, interval: .milliseconds(50), { batches.withLock { $0.flatMap { $0 } } },
            until: { $0.count >= count })
        #expect(all.count == count)
        #expect(Set(all.map(\.modRevision)).count == count)
        #expect(zip(all, all.dropFirst()).allSatisfy { $0.modRevision < $1.modRevision })
        #expect(all.first?.modRevision == first)
        print("etcd watch: catch-up of \(count) changes, first message \(firstCount), resumed after a kill")
    }

    /// Should call onReset (and end) when started from a revision etcd has compacted away.
    @Test func compactedRevisionResets() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: Self.callTimeout)
        let first = try await client.put(Array("/c/a".utf8), Array("1".utf8))
        try await client.put(Array("/c/a".utf8), Array("2".utf8))
        let latest = try await client.put(Array("/c/a".utf8), Array("3".utf8))
        let compaction = try await HTTPClient.postJSON(
            fleet.endpoints[0] + "/v3/kv/compaction",
            JSON.object(["revision": .string(String(latest)), "physical": true]).serialized(),
            timeoutSeconds: Self.callTimeout)
        #expect(compaction.status == 200)

        let recorder = WatchRecorder()
        let watch = recorder.watch(client, "/c/", from: first)
        try watch.start()
        defer { watch.stop() }
        let resets = try await eventually(
            tries: 300, interval: .milliseconds(50), { recorder.resets },
            until: {
                !$0.isEmpty
            })
        #expect(resets.count == 1)
        #expect(resets.first?.code == .storeFailed)
        #expect(resets.first?.message.contains("compacted its history up to revision \(latest)") == true)
        let finished = try await eventually(
            tries: 100, interval: .milliseconds(20), { watch.isFinished }, until: { $0 })
        #expect(finished)
        #expect(recorder.events.isEmpty)

        // From the compaction's revision on the watch works.
        let again = WatchRecorder()
        let resumed = again.watch(client, "/c/", from: latest)
        try resumed.start()
        defer { resumed.stop() }
        let seen = try await eventually(
            tries: 300, interval: .milliseconds(50), { again.events }, until: { !$0.isEmpty })
        #expect(seen.map(\.modRevision) == [latest])
        #expect(again.resets.isEmpty)
    }

    /// Should leave a member that lost its quorum (its stream ended: it
    /// requires a leader) and, once the quorum is back, deliver what changed.
    @Test func leavesAMemberWithoutQuorumAndCatchesUp() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: Self.callTimeout)
        let start = try await client.put(Array("/q/0".utf8), Array("0".utf8))
        let recorder = WatchRecorder()
        let watch = recorder.watch(client, "/q/", from: start)
        try watch.start()
        defer { watch.stop() }
        let streaming = try await eventually(
            tries: 300, interval: .milliseconds(50), { watch.connectedEndpoint }, until: { $0 != nil })
        let kept = try #require(fleet.endpoints.firstIndex { $0 == streaming })
        let others = fleet.endpoints.indices.filter { $0 != kept }
        for index in others { fleet.kill(index) }
        let cutOff = ContinuousClock.now
        // The kept member loses its leader within a few election timeouts and
        // ends the stream; the watch then retries members that are down.
        let left = try await eventually(
            tries: 300, interval: .milliseconds(50), { watch.connectedEndpoint }, until: { $0 == nil })
        #expect(left == nil, "the watch still streams from \(streaming ?? "?"), which has no quorum")
        print("etcd watch: left a member without quorum after \(ContinuousClock.now - cutOff)")

        for index in others { try fleet.start(index) }
        try await fleet.waitUntilServing()
        let back = try await client.put(Array("/q/1".utf8), Array("1".utf8))
        let seen = try await eventually(
            tries: 400, interval: .milliseconds(50), { recorder.events }, until: { $0.count >= 2 })
        #expect(seen.map(\.modRevision) == [start, back])
        #expect(recorder.resets.isEmpty)
    }

    /// Should give up a stream that sent nothing for its idle timeout and
    /// resume, still delivering every change once.
    @Test func resumesAfterAnIdleTimeout() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: Self.callTimeout)
        let start = try await client.put(Array("/i/0".utf8), Array("0".utf8))
        let recorder = WatchRecorder()
        let watch = recorder.watch(client, "/i/", from: start, idle: 1)
        try watch.start()
        defer { watch.stop() }
        // Idle after its first event: given up and resumed every second or so.
        let streams = try await eventually(
            tries: 300, interval: .milliseconds(50), { watch.streamCount }, until: { $0 >= 3 })
        #expect(streams >= 3)
        let next = try await client.put(Array("/i/1".utf8), Array("1".utf8))
        let seen = try await eventually(
            tries: 300, interval: .milliseconds(50), { recorder.events }, until: { $0.count >= 2 })
        #expect(seen.map(\.modRevision) == [start, next])
        #expect(recorder.resets.isEmpty)
    }

    /// Should stop promptly, whether streaming or retrying a dead endpoint,
    /// and leave no thread behind.
    @Test func stopIsPromptAndEndsItsThread() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: Self.callTimeout)
        let recorder = WatchRecorder()
        let watch = recorder.watch(client, "/s/", from: 1)
        try watch.start()
        _ = try await eventually(
            tries: 300, interval: .milliseconds(50), { watch.connectedEndpoint }, until: { $0 != nil })
        let thread = watch.threadID
        #expect(thread > 0)
        #expect(FileManager.default.fileExists(atPath: "/proc/self/task/\(thread)"))
        var started = ContinuousClock.now
        #expect(watch.stop())
        let streamingStop = ContinuousClock.now - started
        #expect(streamingStop < .seconds(1), "stop() took \(streamingStop) while streaming")
        #expect(watch.isFinished)
        #expect(!FileManager.default.fileExists(atPath: "/proc/self/task/\(thread)"))
        try await client.put(Array("/s/after".utf8), Array("x".utf8))
        #expect(recorder.events.isEmpty)

        // Nothing listens at this port: the watch retries with its backoff.
        let port = try EtcdFleet.freePorts(1)[0]
        let nowhere = EtcdClient(endpoints: ["http://127.0.0.1:\(port)"], timeoutSeconds: 1)
        let retrying = WatchRecorder().watch(nowhere, "/s/", from: 1)
        try retrying.start()
        _ = try await eventually(tries: 100, interval: .milliseconds(20), { retrying.threadID }, until: { $0 > 0 })
        let retryingThread = retrying.threadID
        started = ContinuousClock.now
        #expect(retrying.stop())
        let retryingStop = ContinuousClock.now - started
        #expect(retryingStop < .seconds(1), "stop() took \(retryingStop) while retrying")
        #expect(!FileManager.default.fileExists(atPath: "/proc/self/task/\(retryingThread)"))
        print("etcd watch stop(): \(streamingStop) while streaming, \(retryingStop) while retrying")
    }
}
