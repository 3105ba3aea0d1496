# shellcheck shell=bash
# The release build of vaultd and vaultctl, for scripts/run, scripts/install
# and scripts/bench. The Swift runtime is linked statically: vaultctl starts
# in a third of the time (it runs once per token read), and vaultd maps only
# the runtime code it uses. Every caller passes the same flags, so switching
# between them never rebuilds.
#
# release_build [swift build arguments...]
release_build() {
    swift build -c release --static-swift-stdlib "$@"
}
