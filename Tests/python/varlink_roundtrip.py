"""Talks to vaultd with the independent `varlink` package from PyPI.

Usage: varlink_roundtrip.py ADDRESS USER
Exits non-zero with a message on the first thing that is not as expected.
"""

import sys

import varlink

TOKEN = "py_token_abcdefghijklmnopqrstuvwxyz"


def check(condition, message):
    if not condition:
        print("FAILED: " + message)
        sys.exit(1)


def main():
    address, user = sys.argv[1], sys.argv[2]
    with varlink.Client(address=address) as client:
        with client.open("org.varlink.service") as service:
            info = service.GetInfo()
            check("io.vaultd.Vault" in info["interfaces"], "GetInfo lists io.vaultd.Vault: %r" % info)
            description = service.GetInterfaceDescription(interface="io.vaultd.Vault")["description"]
            check(description.startswith("# vaultd"), "GetInterfaceDescription returns the interface")
        # open() parses the interface description: it must be valid Varlink IDL.
        with client.open("io.vaultd.Vault") as vault:
            login = vault.Login(provider="demo", user=user, token=TOKEN)
            check(login["created"] is True, "Login created the session: %r" % login)
            session = vault.GetSession(provider="demo", user=user)["session"]
            check(session["state"] == "logged", "GetSession says logged: %r" % session)
            check(TOKEN not in str(session), "GetSession never shows the token")
            check(session["token"] == TOKEN[:2] + "*" * 8 + TOKEN[-2:], "token masked: first 2 and last 2 around 8 stars")
            token = vault.GetToken(provider="demo", user=user)
            check(token["token"] == TOKEN, "GetToken returns the token")
            vault.Logout(provider="demo", user=user)
            try:
                vault.Logout(provider="demo", user=user)
                check(False, "a second Logout must fail")
            except varlink.VarlinkError as error:
                check(error.error() == "io.vaultd.Vault.NotLoggedIn", "NotLoggedIn: %r" % error.error())
                check(error.parameters()["code"] == "ERR_NOT_LOGGED_IN", "code ERR_NOT_LOGGED_IN")
    print("roundtrip ok")


if __name__ == "__main__":
    main()
