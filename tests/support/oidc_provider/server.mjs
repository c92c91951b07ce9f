// A real OpenID Connect provider (panva/oidc-provider) on loopback for the sign-in tests: one
// confidential client, PKCE required, accounts and their groups from the environment, the
// library's own development login page (any password), consent granted for the test client.
// Started by tests/support/oidc.py; nothing here is part of the product.
import Provider from "oidc-provider";

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;
const accounts = JSON.parse(process.env.OIDC_ACCOUNTS || "{}");

const configuration = {
  clients: [
    {
      client_id: process.env.CLIENT_ID,
      client_secret: process.env.CLIENT_SECRET,
      redirect_uris: [process.env.REDIRECT_URI],
      grant_types: ["authorization_code"],
      response_types: ["code"],
    },
  ],
  claims: {
    openid: ["sub"],
    profile: ["preferred_username", "name"],
    email: ["email", "email_verified"],
    groups: ["groups"],
  },
  scopes: ["openid", "profile", "email", "groups"],
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true } },
  // The ID token carries the claims too (the relying party reads them from it).
  conformIdTokenClaims: false,
  cookies: { keys: ["xagent-test-oidc-provider"] },
  async findAccount(ctx, id) {
    const account = accounts[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          preferred_username: id,
          name: account.name || id,
          email: account.email || `${id}@example.test`,
          email_verified: true,
          groups: account.groups || [],
        };
      },
    };
  },
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope("openid profile email groups");
    grant.addOIDCClaims(["preferred_username", "name", "email", "email_verified", "groups"]);
    await grant.save();
    return grant;
  },
};

const provider = new Provider(issuer, configuration);
provider.listen(port, "127.0.0.1", () => console.log(`oidc provider listening on ${issuer}`));
