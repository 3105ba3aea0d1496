import Testing

@testable import VaultDaemon

/// The timeout of a Secret Service call (`StoreTimeout=`).
@Suite("Store call timeouts", .ownThreads, .timeLimit(.minutes(1)))
struct CancellableTests {
    @Test("Should cancel a store call at its timeout, and drop the timer of a call that ended")
    func timeoutAndRelease() async {
        let running = Cancellable(timeoutSeconds: 1)
        weak var ended: Cancellable?
        do {
            let call = Cancellable(timeoutSeconds: 1)
            ended = call
            #expect(!call.isCancelled)
        }
        // A timer still armed would keep the call's cancellable (and a wakeup) for the whole timeout.
        #expect(ended == nil, "an ended call's cancellable outlived the call")
        for _ in 0..<1_000 where !running.isCancelled { try? await Task.sleep(for: .milliseconds(10)) }
        #expect(running.isCancelled, "the call in progress was not cancelled at its timeout")
    }
}
