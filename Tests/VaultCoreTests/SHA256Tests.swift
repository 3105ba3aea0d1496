import Testing
import VaultCore

/// The hex digest of `text`'s UTF-8 bytes.
private func hex(_ text: String) -> String { SHA256.hexDigest(of: text) }

@Suite("SHA256: FIPS 180-4", .timeLimit(.minutes(5)))
struct SHA256Tests {
    // The examples of FIPS 180-4 / NIST's "Example Algorithm" documents and the SHAVS short messages.
    @Test("Should give the NIST digests of the empty message, \"abc\" and the 448- and 896-bit messages")
    func nistVectors() {
        #expect(hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(
            hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        #expect(
            hex(
                "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"
            ) == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1")
    }

    @Test("Should give the NIST digest of one byte 0xd3 (SHAVS short message, Len = 8)")
    func oneByte() {
        #expect(
            SHA256.hex(SHA256.hash([0xd3])) == "28969cdfa74a12c82f3bad960b0b000aca2ac329deea5c2328ebc6f2ba9802c1")
    }

    @Test("Should give the NIST digest of one million 'a', fed in uneven pieces")
    func millionA() {
        var hasher = SHA256()
        let piece = [UInt8](repeating: UInt8(ascii: "a"), count: 997)
        var left = 1_000_000
        while left > 0 {
            let n = min(left, piece.count)
            hasher.update(piece[0..<n])
            left -= n
        }
        #expect(SHA256.hex(hasher.finalize()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    @Test(
        "Should pad correctly at the block boundaries (55, 56, 63, 64, 65, 119, 128 bytes)",
        arguments: [
            (55, "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59"),
            (56, "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562"),
            (63, "29af2686fd53374a36b0846694cc342177e428d1647515f078784d69cdb9e488"),
            (64, "fdeab9acf3710362bd2658cdc9a29e8f9c757fcf9811603a8c447cd1d9151108"),
            (65, "4bfd2c8b6f1eec7a2afeb48b934ee4b2694182027e6d0fc075074f2fabb31781"),
            (119, "da18797ed7c3a777f0847f429724a2d8cd5138e6ed2895c3fa1a6d39d18f7ec6"),
            (128, "471fb943aa23c511f6f72f8d1652d9c880cfa392ad80503120547703e56a2be5"),
        ])
    func boundaries(length: Int, digest: String) {
        let bytes = (0..<length).map { UInt8($0 % 251) }
        #expect(SHA256.hex(SHA256.hash(bytes)) == digest)
        // The same bytes, one at a time.
        var hasher = SHA256()
        for byte in bytes { hasher.update(CollectionOfOne(byte)) }
        #expect(SHA256.hex(hasher.finalize()) == digest)
    }

    @Test("Should hash a secret's own bytes as the same text would hash")
    func secretDigest() {
        #expect(SHA256.hexDigest(of: Secret("abc")) == hex("abc"))
    }

    @Test("Should read back exactly 64 lowercase hex digits, and nothing else")
    func hexRoundTrip() {
        let digest = SHA256.hash(Array("abc".utf8))
        #expect(SHA256.digest(hex: SHA256.hex(digest)) == digest)
        let text = SHA256.hex(digest)
        #expect(SHA256.digest(hex: text.uppercased()) == nil)
        #expect(SHA256.digest(hex: String(text.dropLast())) == nil)
        #expect(SHA256.digest(hex: text + "0") == nil)
        #expect(SHA256.digest(hex: String(text.dropLast()) + "g") == nil)
        #expect(SHA256.digest(hex: "") == nil)
    }

    @Test("Should compare digests: equal only when every byte is, and never across lengths")
    func constantTimeEqual() {
        let a = SHA256.hash(Array("a".utf8))
        var b = a
        #expect(SHA256.constantTimeEqual(a, b))
        b[31] ^= 1
        #expect(!SHA256.constantTimeEqual(a, b))
        b = a
        b[0] ^= 0x80
        #expect(!SHA256.constantTimeEqual(a, b))
        #expect(!SHA256.constantTimeEqual(a, Array(a.dropLast())))
        #expect(SHA256.constantTimeEqual([], []))
    }
}
