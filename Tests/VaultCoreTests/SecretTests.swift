import Testing
import VaultCore

@Suite("Secret")
struct SecretTests {
    private let raw = "invalid_token_abcdefghij_xyz"

    @Test("Should mask a long secret as its first five and last five characters around ten stars")
    func maskLong() {
        #expect(Secret.mask(raw) == "inval**********j_xyz")
        #expect(Secret(raw).masked == "inval**********j_xyz")
    }

    @Test("Should mask a secret of exactly 20 characters with prefix and suffix")
    func maskBoundary() {
        #expect(Secret.mask("abcdefghijklmnopqrst") == "abcde**********pqrst")
    }

    @Test("Should mask a secret shorter than 20 characters with stars only, at least four")
    func maskShort() {
        #expect(Secret.mask("abcdefghijklmnopqrs") == String(repeating: "*", count: 19))
        #expect(Secret.mask("abc") == "****")
        #expect(Secret.mask("") == "****")
        #expect(Secret.mask("abcde") == "*****")
    }

    @Test("Should count characters, not bytes, when masking")
    func maskCharacters() {
        let value = "ééééé" + String(repeating: "x", count: 10) + "😀😀😀😀😀"
        #expect(Secret.mask(value) == "ééééé**********😀😀😀😀😀")
    }

    @Test("Should never show the raw value when printed, interpolated or reflected")
    func neverPrinted() {
        let secret = Secret(raw)
        #expect(secret.description == "inval**********j_xyz")
        #expect(secret.debugDescription == "Secret(inval**********j_xyz)")
        #expect("token=\(secret)" == "token=inval**********j_xyz")
        #expect(!String(describing: secret).contains(raw))
        #expect(!String(reflecting: secret).contains(raw))
        #expect(!"\([secret])".contains(raw))
        #expect(!"\(Optional(secret) as Any)".contains(raw))
    }

    @Test("Should never show the raw value when dumped, as its documentation promises")
    func neverDumped() {
        var dumped = ""
        dump(Secret(raw), to: &dumped)
        #expect(!dumped.contains(raw), "dump(secret) printed: \(dumped)")
    }

    @Test("Should keep the raw value for the places that must reveal it")
    func revealed() {
        #expect(Secret(raw).revealed == raw)
        #expect(Secret(raw) == Secret(raw))
        #expect(Secret(raw) != Secret(raw + "x"))
    }
}
