import CSodium
import Glibc
import VaultCore
import VaultSystem

/// The 256-bit key that seals the rows of the SQLite engine.
///
/// The bytes live in libsodium's guarded memory (`sodium_malloc`: locked
/// against swapping, guard pages around it, zeroed when freed) and are
/// read-only once set. The key's `id` is a keyed hash of the key, 8 bytes in
/// hex: it names the key in messages and on every row without saying
/// anything about it, and lets vaultd tell a wrong key from a damaged row
/// before it opens a single record.
public final class DataKey: @unchecked Sendable {
    /// The size of a key, in bytes.
    public static let byteCount = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)

    /// Sixteen hex digits derived from the key (never the key itself).
    public let id: String
    let bytes: UnsafeMutableRawPointer

    /// A key holding a copy of `material`, which must be exactly `byteCount`
    /// bytes; the caller wipes `material`.
    public init(copying material: [UInt8], source: String) throws(VaultError) {
        guard material.count == DataKey.byteCount else {
            throw VaultError(
                .storeFailed,
                "the data key from \(source) holds \(material.count) bytes; it must hold exactly \(DataKey.byteCount) random bytes (create one with: head -c 32 /dev/urandom)"
            )
        }
        Sealing.initialize()
        guard let bytes = sodium_malloc(DataKey.byteCount) else {
            throw VaultError(.internalError, "cannot allocate guarded memory for the data key")
        }
        material.withUnsafeBytes { bytes.copyMemory(from: $0.baseAddress!, byteCount: DataKey.byteCount) }
        self.bytes = bytes
        self.id = DataKey.identifier(of: UnsafeRawPointer(bytes))
        sodium_mprotect_readonly(bytes)
    }

    /// A new random key.
    public static func random() -> DataKey {
        Sealing.initialize()
        var material = [UInt8](repeating: 0, count: byteCount)
        defer { material.wipe() }
        randombytes_buf(&material, byteCount)
        // Cannot fail: the size is right.
        return try! DataKey(copying: material, source: "the random generator")
    }

    /// The key as lower-case hex, for the Secret Service item that keeps it;
    /// the caller wipes it.
    func hexDigits() -> [UInt8] {
        let digits = Array("0123456789abcdef".utf8)
        let raw = UnsafeRawBufferPointer(start: bytes, count: DataKey.byteCount)
        var out = [UInt8](repeating: 0, count: DataKey.byteCount * 2)
        for (index, byte) in raw.enumerated() {
            out[2 * index] = digits[Int(byte >> 4)]
            out[2 * index + 1] = digits[Int(byte & 0x0f)]
        }
        return out
    }

    /// A key read back from `hexDigits()`.
    static func fromHex(_ text: [UInt8], source: String) throws(VaultError) -> DataKey {
        func value(_ digit: UInt8) -> UInt8? {
            switch digit {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return digit - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return digit - UInt8(ascii: "a") + 10
            default: return nil
            }
        }
        var material = [UInt8](repeating: 0, count: text.count / 2)
        defer { material.wipe() }
        guard text.count == 2 * DataKey.byteCount else {
            throw VaultError(
                .storeFailed,
                "the data key in \(source) is not \(2 * DataKey.byteCount) hex digits; it was changed by hand or by another program"
            )
        }
        for index in material.indices {
            guard let high = value(text[2 * index]), let low = value(text[2 * index + 1]) else {
                throw VaultError(.storeFailed, "the data key in \(source) is not hex digits; it was changed by hand")
            }
            material[index] = high << 4 | low
        }
        return try DataKey(copying: material, source: source)
    }

    private static func identifier(of key: UnsafeRawPointer) -> String {
        let label = Array("io.vaultd.DataKey id".utf8)
        var digest = [UInt8](repeating: 0, count: 8)
        _ = crypto_generichash(
            &digest, digest.count, label, UInt64(label.count), key.assumingMemoryBound(to: UInt8.self),
            DataKey.byteCount)
        return digest.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }

    deinit { sodium_free(bytes) }
}

/// Sealing and opening with XChaCha20-Poly1305 (libsodium's IETF variant).
///
/// Why this AEAD and not AES-256-GCM: every write seals with a fresh random
/// nonce, and a store of 100,000 sessions refreshing hourly seals close to
/// 10⁹ times a year under one key. GCM's 96-bit nonce makes random nonces
/// unsafe past about 2³² messages per key; XChaCha20's 192-bit nonce makes
/// a collision negligible at any rate vaultd could reach, with no counter to
/// keep crash-safe. It is also constant-time without AES instructions.
///
/// A sealed value is `nonce ‖ ciphertext ‖ tag`. The associated data binds
/// it to where it is stored (the kind of row, the account, the owner), so a
/// row copied onto another account's fails to open.
public enum Sealing {
    /// Bytes a sealed value adds to its plaintext: the nonce and the tag.
    public static let overhead = nonceBytes + tagBytes
    static let nonceBytes = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    static let tagBytes = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)

    private static let initialized: Bool = sodium_init() >= 0

    static func initialize() {
        precondition(initialized, "libsodium failed to initialize")
    }

    /// `plaintext` sealed under `key`, bound to `associatedData`.
    public static func seal(_ plaintext: [UInt8], associatedData: [UInt8], key: DataKey) -> [UInt8] {
        initialize()
        var sealed = [UInt8](repeating: 0, count: nonceBytes + plaintext.count + tagBytes)
        sealed.withUnsafeMutableBufferPointer { out in
            randombytes_buf(out.baseAddress!, nonceBytes)
            var length: UInt64 = 0
            _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                out.baseAddress! + nonceBytes, &length, plaintext, UInt64(plaintext.count), associatedData,
                UInt64(associatedData.count), nil, out.baseAddress!, key.bytes.assumingMemoryBound(to: UInt8.self))
        }
        return sealed
    }

    /// The plaintext of `sealed`, or nil when it was not sealed under `key`
    /// with `associatedData` or was changed since. The caller wipes it.
    public static func open(_ sealed: UnsafeRawBufferPointer, associatedData: [UInt8], key: DataKey) -> [UInt8]? {
        initialize()
        guard sealed.count >= overhead, let base = sealed.baseAddress?.assumingMemoryBound(to: UInt8.self) else {
            return nil
        }
        var plaintext = [UInt8](repeating: 0, count: sealed.count - overhead)
        var length: UInt64 = 0
        let result = plaintext.withUnsafeMutableBufferPointer { out in
            crypto_aead_xchacha20poly1305_ietf_decrypt(
                out.baseAddress, &length, nil, base + nonceBytes, UInt64(sealed.count - nonceBytes), associatedData,
                UInt64(associatedData.count), base, key.bytes.assumingMemoryBound(to: UInt8.self))
        }
        guard result == 0 else { return nil }
        return plaintext
    }

    /// Associated data from its parts, each length-prefixed, so that no two
    /// different lists of parts give the same bytes.
    public static func associatedData(_ parts: [String]) -> [UInt8] {
        let prefix = "io.vaultd.sealed/1".utf8
        var out: [UInt8] = []
        out.reserveCapacity(prefix.count + parts.reduce(0) { $0 + 4 + $1.utf8.count })
        out.append(contentsOf: prefix)
        for part in parts {
            let count = UInt32(part.utf8.count)
            out.append(UInt8(truncatingIfNeeded: count >> 24))
            out.append(UInt8(truncatingIfNeeded: count >> 16))
            out.append(UInt8(truncatingIfNeeded: count >> 8))
            out.append(UInt8(truncatingIfNeeded: count))
            out.append(contentsOf: part.utf8)
        }
        return out
    }
}
