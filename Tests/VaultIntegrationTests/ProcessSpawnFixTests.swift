import CProcessSpawnFix
import Foundation
import Testing

/// The test process's guard against Foundation's `Process.run()` over-read
/// (see `Tests/Support/CProcessSpawnFix`): it holds only while blocks the
/// size of glibc's directory buffer get mappings of their own.
@Suite("Test process: Foundation Process.run workaround", .ownThreads)
struct ProcessSpawnFixTests {
    @Test(
        "Should serve a directory-buffer-sized block from a mapping of its own when malloc grows, with room past its end"
    )
    func directoryBufferIsMappedApart() throws {
        // glibc's opendir() allocates its DIR header and a 32 KiB buffer in one block.
        let size = 32 * 1024 + 64
        #expect(vaultd_tests_mmap_threshold() <= size)
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        // A mapped chunk starts on a page with a 16-byte header; a heap chunk
        // lands anywhere. The threshold applies when malloc has to grow, not
        // while it can split the free top of this thread's arena (which a
        // first block found in one run of three): blocks are taken until the
        // top is used up, at most 64 (2 MiB), and the next comes from a mapping.
        var blocks: [UnsafeMutableRawPointer] = []
        defer { for block in blocks { free(block) } }
        var mapped: Int?
        for _ in 0..<64 where mapped == nil {
            let block = try #require(malloc(size))
            blocks.append(block)
            let address = Int(bitPattern: block)
            if address % page == 16 { mapped = address }
        }
        let address = try #require(mapped, "64 blocks of \(size) bytes, none from a mapping of its own")
        // What the over-read may touch, up to 256 bytes past the end, is still
        // on the mapping's last page.
        let roomOnLastPage = page - (address + size) % page
        #expect(roomOnLastPage >= 256)
    }

    @Test("Should answer readdir() with its own copy of an entry whose full struct would cross into an unmapped page")
    func readdirEntryIsWhole() throws {
        #expect(vaultd_tests_readdir_is_replaced() == 1)
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let region = try #require(
            mmap(nil, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))
        defer { munmap(region, 2 * page) }
        #expect(mprotect(region + page, page, PROT_NONE) == 0)
        // A 24-byte record named "7" that ends the readable page, as the last
        // record of a full directory buffer may.
        let length = 24
        let record = region + page - length
        memset(record, 0, length)
        record.storeBytes(of: UInt16(length), toByteOffset: 16, as: UInt16.self)
        record.storeBytes(of: UInt8(ascii: "7"), toByteOffset: 19, as: UInt8.self)
        var returned: UnsafeRawPointer?
        #expect(vaultd_tests_whole_entry_for(record, length, &returned) == 1)
        let entry = try #require(returned)
        #expect(entry != UnsafeRawPointer(record))
        // The whole struct is readable (this read is Foundation's over-read).
        let copy = entry.load(as: dirent.self)
        #expect(withUnsafeBytes(of: copy.d_name) { $0[0] } == UInt8(ascii: "7"))
        // A record with room after it is returned where it is.
        let middle = region + 64
        memset(middle, 0, length)
        middle.storeBytes(of: UInt16(length), toByteOffset: 16, as: UInt16.self)
        #expect(vaultd_tests_whole_entry_for(middle, length, &returned) == 0)
        #expect(returned == UnsafeRawPointer(middle))
    }

    @Test("Should still list a directory whole through readdir()")
    func listsDirectories() throws {
        let directory = try #require(opendir("/proc/self/fd"))
        defer { closedir(directory) }
        var names: Set<String> = []
        while let entry = readdir(directory) {
            names.insert(
                withUnsafeBytes(of: entry.pointee.d_name) {
                    String(cString: $0.bindMemory(to: CChar.self).baseAddress!)
                })
        }
        #expect(names.isSuperset(of: [".", "..", "0", "1", "2"]))
    }

    @Test("Should keep a test's pipe out of every child it was not handed, and still hand a child its own stdio")
    func pipesStayWithTheirChild() throws {
        #expect(vaultd_tests_pipe_is_replaced() == 1)
        // Another test's pipe, open while a long-lived child starts without
        // a list of descriptors to close (posix_spawn as PrivateKeyring
        // does; Process.run() between its listing and its spawn).
        let pipe = Pipe()
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for descriptor: Int32 in 0...2 {
            posix_spawn_file_actions_addopen(&actions, descriptor, "/dev/null", O_RDWR, 0)
        }
        let arguments = ["/bin/sleep", "30"]
        let argv = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var child: pid_t = 0
        try #require(posix_spawn(&child, arguments[0], &actions, nil, argv, environ) == 0)
        defer {
            kill(child, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(child, &status, 0)
        }
        // The writer is done: the reader sees the end at once, not when the child exits.
        try pipe.fileHandleForWriting.close()
        var reader = pollfd(fd: pipe.fileHandleForReading.fileDescriptor, events: Int16(POLLIN), revents: 0)
        let ready = poll(&reader, 1, 5_000)
        #expect(ready == 1, "the pipe's end did not come: the child holds its write end")
        var byte: UInt8 = 0
        if ready == 1 { #expect(read(reader.fd, &byte, 1) == 0) }
        // A child handed a pipe as its stdin and stdout still has them.
        let echoed = try runCommand(URL(fileURLWithPath: "/bin/cat"), [], input: "through the pipes")
        #expect(echoed.status == 0 && echoed.stdout == "through the pipes")
    }
}
