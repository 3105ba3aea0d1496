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

# The installable vaultctl: a fully static executable (static glibc as well as
# the static Swift runtime, `-static-executable`), printed as one path on
# stdout; build output goes to stderr. vaultctl runs once per token a script
# reads, so its start-up is its speed: with nothing for ld.so to load or
# relocate it starts in about half the time of the release_build one (see
# docs/BENCHMARKS.md, "vaultctl token against git-credential-cache get").
# Swift flags apply to every product of one build, and vaultd must stay
# dynamic (libsecret, libsystemd, libcurl), so this is a build of its own in
# .build/static: switching between it and release_build never rebuilds either.
#
# vaultctl makes no NSS lookup (getpwnam and friends: a static glibc can load
# NSS modules only from the glibc build it was linked with); user names are
# resolved by VaultClient's UserLookup. The one linker warning left, "Using
# 'dlopen' in statically linked applications", comes from the Swift runtime's
# LibPrespecialized.cpp (libswiftCore.a): it calls dlopen only when
# SWIFT_DEBUG_ENABLE_LIB_PRESPECIALIZED and SWIFT_DEBUG_LIB_PRESPECIALIZED_PATH
# are set, and then with RTLD_NOLOAD (it never loads a library).
#
# vaultctl_release_binary [swift build arguments...]
vaultctl_release_binary() {
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd) || return 1
    local args=(-c release --static-swift-stdlib -Xswiftc -static-executable
        --package-path "$root" --scratch-path "$root/.build/static" "$@")
    swift build "${args[@]}" --product vaultctl >&2 || return 1
    local bin_dir
    bin_dir=$(swift build "${args[@]}" --show-bin-path) || return 1
    echo "$bin_dir/vaultctl"
}
