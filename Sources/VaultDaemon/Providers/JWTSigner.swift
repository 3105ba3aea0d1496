import CCrypto
import Glibc
import VaultCore
import VaultSystem

/// Signs JWT assertions with the private key of `JWTKeyFile=`, through
/// libcrypto. The key is read anew for each assertion (a replaced key file
/// is used at once), its PEM bytes wiped once libcrypto has parsed them, and
/// libcrypto's key freed (which clears it) once it has signed. Neither the
/// key nor an assertion is ever in a message.
enum JWTSigner {
    /// Why no assertion was signed: for a log line or a client's error; no key material.
    struct Failure: Error, Equatable {
        var reason: String
    }

    /// The largest key file read: a 16384-bit RSA key in PEM is under 13 KiB.
    static let fileLimit = 64 * 1024

    /// The file `JWTKeyFile=` names: an absolute path as it is, a relative
    /// one in `$CREDENTIALS_DIRECTORY` (systemd's credentials).
    static func path(
        _ keyFile: String, credentials: String? = Environment.get("CREDENTIALS_DIRECTORY")
    ) throws(Failure) -> String {
        if keyFile.hasPrefix("/") { return keyFile }
        guard let directory = credentials, !directory.isEmpty else {
            throw Failure(
                reason:
                    "JWTKeyFile=\(keyFile) is a relative path, which is taken in $CREDENTIALS_DIRECTORY, and that is not set (LoadCredential= sets it)"
            )
        }
        return directory + "/" + keyFile
    }

    /// The key file's bytes, read through a `PathTrust.vaultd` walk: every
    /// directory on the way and the file itself writable by no one but root
    /// and vaultd's user, and the file readable by no others.
    static func read(_ keyFile: String) throws(Failure) -> [UInt8] {
        let path = try path(keyFile)
        let outcome: PathTrust.Outcome
        do { outcome = try PathTrust.vaultd.open(path, leaf: .file) } catch {
            throw Failure(reason: "the JWT key file cannot be opened: \(error)")
        }
        let fd: Int32
        switch outcome {
        case .opened(let opened): fd = opened
        case .missing: throw Failure(reason: "the JWT key file \(path) does not exist")
        case .refused(let why): throw Failure(reason: "the JWT key file is not trusted: \(why)")
        }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0, status.st_mode & S_IFMT == S_IFREG else {
            throw Failure(reason: "the JWT key file \(path) is not a regular file")
        }
        guard status.st_mode & 0o004 == 0 else {
            throw Failure(
                reason:
                    "the JWT key file \(path) is readable by others (mode \(String(status.st_mode & 0o7777, radix: 8))); make it readable by vaultd alone (chmod 600, or a systemd credential)"
            )
        }
        do { return try Files.readAll(fd, limit: fileLimit, name: path) } catch {
            throw Failure(reason: "the JWT key file cannot be read: \(error)")
        }
    }

    /// `claims` signed with the key of `keyFile` (RS256 for an RSA key of at
    /// least 2048 bits, ES256 for an EC P-256 key): the compact JWS.
    static func sign(_ claims: JWTClaims, keyFile: String) throws(Failure) -> String {
        var pem = try read(keyFile)
        defer { pem.wipe() }
        guard pem.count <= Int(Int32.max),
            let key = pem.withUnsafeBytes({ vaultd_read_private_key($0.baseAddress, Int32($0.count)) })
        else {
            throw Failure(
                reason:
                    "the JWT key file holds no private key libcrypto can read (a PEM private key without a passphrase, RSA or EC P-256)"
            )
        }
        defer { EVP_PKEY_free(key) }
        let algorithm = try algorithm(of: key)
        let input = JWS.signingInput(algorithm, claims)
        var signature = try digestSign(input, with: key)
        if algorithm == .es256 {
            guard let raw = JWS.rawECDSASignature(der: signature) else {
                throw Failure(reason: "libcrypto's ECDSA signature is not the DER sequence of two integers")
            }
            signature = raw
        }
        return JWS.compact(signingInput: input, signature: signature)
    }

    /// The algorithm `key` signs with; a key of another kind, curve or a too
    /// small RSA key is refused.
    static func algorithm(of key: OpaquePointer) throws(Failure) -> JWTAlgorithm {
        var bits: Int32 = 0
        switch vaultd_jwt_key_kind(key, &bits) {
        case Int32(VAULTD_JWT_KEY_RSA.rawValue):
            guard bits >= 2048 else {
                throw Failure(reason: "the JWT key is RSA of \(bits) bits; RS256 needs at least 2048 (RFC 7518 3.3)")
            }
            return .rs256
        case Int32(VAULTD_JWT_KEY_EC_P256.rawValue): return .es256
        default:
            throw Failure(reason: "the JWT key is neither RSA (RS256) nor EC on P-256 (ES256)")
        }
    }

    /// SHA-256 of `input` signed with `key` by `EVP_DigestSign`: PKCS#1 v1.5
    /// for RSA (libcrypto's default padding), DER ECDSA for EC.
    static func digestSign(_ input: [UInt8], with key: OpaquePointer) throws(Failure) -> [UInt8] {
        guard let context = EVP_MD_CTX_new() else { throw Failure(reason: "libcrypto could not make a digest context") }
        defer {
            EVP_MD_CTX_free(context)
            ERR_clear_error()
        }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, key) == 1 else {
            throw Failure(reason: "libcrypto refused to sign with the JWT key")
        }
        var length = 0
        guard EVP_DigestSign(context, nil, &length, input, input.count) == 1, length > 0 else {
            throw Failure(reason: "libcrypto could not size the signature")
        }
        var signature = [UInt8](repeating: 0, count: length)
        guard EVP_DigestSign(context, &signature, &length, input, input.count) == 1 else {
            throw Failure(reason: "libcrypto could not sign the JWT")
        }
        return Array(signature.prefix(length))
    }
}
