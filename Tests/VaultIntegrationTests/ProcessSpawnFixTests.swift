import CProcessSpawnFix
import Foundation
import Testing

/// The test process's guard against Foundation's `Process.run()` over-read
/// (see `Tests/Support/CProcessSpawnFix`): it holds only while blocks the
/// size of glibc's directory buffer get mappings of their own.
@Suite("Test process: Foundation Process.run workaround")
struct ProcessSpawnFixTests {
    @Test("Should serve a directory-buffer-sized block from a mapping of its own, with room past its end")
    func directoryBufferIsMappedApart() throws {
        // glibc's opendir() allocates its DIR header and a 32 KiB buffer in one block.
        let size = 32 * 1024 + 64
        #expect(vaultd_tests_mmap_threshold() <= size)
        let block = try #require(malloc(size))
        defer { free(block) }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let address = Int(bitPattern: block)
        // A mapped chunk starts on a page with a 16-byte header; a heap chunk
        // lands anywhere.
        #expect(address % page == 16, "block at \(String(address, radix: 16)) is on the heap")
        // What the over-read may touch, up to 256 bytes past the end, is still
        // on the mapping's last page.
        let roomOnLastPage = page - (address + size) % page
        #expect(roomOnLastPage >= 256)
    }
}
