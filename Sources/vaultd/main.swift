import CWipeOnFree
import Glibc
import VaultDaemon
import VaultFleet

// Every heap block vaultd frees is zeroed first (Sources/CWipeOnFree): the
// Swift strings a token passes through cannot be wiped by hand.
_ = vaultd_wipe_on_free_enabled()
exit(Daemon.main(arguments: Array(CommandLine.arguments.dropFirst()), openShared: EtcdStore.opener))
