import Glibc
import VaultCLI

exit(VaultCtl.main(Array(CommandLine.arguments.dropFirst())))
