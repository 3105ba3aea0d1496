import Testing
import VaultCore

@Suite("Secret", .timeLimit(.minutes(5)))
struct SecretTests {
    private let raw = "invalid_token_abcdefghij_xyz"

    @Test("Should mask a long secret as its first two and last two characters around eight stars")
    func maskLong() {
        #expect(Secret.mask(raw) == "in********yz")
        #expect(Secret(raw).masked == "in********yz")
    }

    @Test("Should show two and two characters from 16 on, one and one from 8, none below")
    func maskBoundaries() {
        #expect(Secret.mask("abcdefghijklmnop") == "ab********op")
        #expect(Secret.mask("abcdefghijklmno") == "a********o")
        #expect(Secret.mask("abcdefgh") == "a********h")
        #expect(Secret.mask("abcdefg") == "********")
        #expect(Secret.mask("abc") == "********")
        #expect(Secret.mask("") == "********")
    }

    @Test("Should never show more than four characters, nor more than a quarter of the secret")
    func maskShowsLittle() {
        for length in 0...200 {
            let value = String((0..<length).map { Character(UnicodeScalar(UInt8(65 + $0 % 26))) })
            let shown = Secret.mask(value).filter { $0 != "*" }.count
            #expect(shown <= 4 && shown * 4 <= length, "length \(length): \(Secret.mask(value))")
        }
    }

    @Test("Should count characters, not bytes, when masking")
    func maskCharacters() {
        let value = "éé" + String(repeating: "x", count: 12) + "😀😀"
        #expect(Secret.mask(value) == "éé********😀😀")
    }

    @Test("Should never show the raw value when printed, interpolated or reflected")
    func neverPrinted() {
        let secret = Secret(raw)
        #expect(secret.description == "in********yz")
        #expect(secret.debugDescription == "Secret(in********yz)")
        #expect("token=\(secret)" == "token=in********yz")
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
