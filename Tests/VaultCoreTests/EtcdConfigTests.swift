import Testing
import VaultCore

@Suite("[Etcd] section", .timeLimit(.minutes(5)))
struct EtcdConfigTests {
    /// Should read several endpoints separated by spaces and commas, and every other key.
    @Test func readsEverySetting() throws {
        let config = try ConfigParser.parse(
            """
            [Vault]
            Store=etcd

            [Etcd]
            Endpoints=http://10.0.0.1:2379, https://etcd-b:2379 http://[::1]:2379
            KeyPrefix=/fleet-a/
            CAFile=/etc/vaultd/etcd-ca.pem
            CertFile=/etc/vaultd/host.pem
            KeyFile=/etc/vaultd/host.key
            Timeout=10s
            LockTTL=3s
            """, file: "a.conf")
        #expect(config.storeEngine == .etcd)
        #expect(config.etcd.endpoints == ["http://10.0.0.1:2379", "https://etcd-b:2379", "http://[::1]:2379"])
        #expect(config.etcd.keyPrefix == "/fleet-a/")
        #expect(config.etcd.caFile == "/etc/vaultd/etcd-ca.pem")
        #expect(config.etcd.certFile == "/etc/vaultd/host.pem")
        #expect(config.etcd.keyFile == "/etc/vaultd/host.key")
        #expect(config.etcd.timeoutSeconds == 10)
        #expect(config.etcd.lockTTLSeconds == 3)
    }

    /// Should default to no endpoint, prefix /vaultd/, no TLS files, 5 s and locks of 10 s.
    @Test func defaults() throws {
        let etcd = try ConfigParser.parse("[Etcd]\n", file: "a.conf").etcd
        #expect(etcd == EtcdSettings())
        #expect(etcd.keyPrefix == "/vaultd/")
        #expect(etcd.timeoutSeconds == 5)
        #expect(etcd.lockTTLSeconds == 10)
    }

    /// Should refuse what is not an etcd setting, naming the file, the line and the key.
    @Test(
        arguments: [
            ("Endpoints=", "key 'Endpoints'"), ("Endpoints=127.0.0.1:2379", "key 'Endpoints'"),
            ("Endpoints=ftp://a:2379", "key 'Endpoints'"), ("Endpoints=http://", "key 'Endpoints'"),
            ("KeyPrefix=/vaultd", "key 'KeyPrefix'"), ("KeyPrefix=", "key 'KeyPrefix'"),
            ("CAFile=ca.pem", "key 'CAFile'"), ("CertFile=/a.pem", "keys 'CertFile' and 'KeyFile'"),
            ("KeyFile=/a.key", "keys 'CertFile' and 'KeyFile'"), ("Timeout=0", "key 'Timeout'"),
            ("LockTTL=1s", "key 'LockTTL'"), ("LockTTL=10min", "key 'LockTTL'"), ("LockTTL=soon", "key 'LockTTL'"),
            ("Watch=yes", "unknown key 'Watch' in [Etcd]"),
        ])
    func refusesBadValues(_ line: String, _ named: String) throws {
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse("[Etcd]\n\(line)\n", file: "a.conf")
        }
        #expect(error.code == .invalidConfig)
        #expect(error.message.hasPrefix("a.conf:2: \(named)"), "\(error.message)")
    }
}
