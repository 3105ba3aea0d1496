import Glibc
import VaultDaemon

exit(Daemon.main(arguments: Array(CommandLine.arguments.dropFirst())))
