// Package policy holds rls's caller policy: which callers may ask about which domains, and
// whether they may refund (is_negative_hits), send limit overrides (a descriptor's limit) or
// spend more than a number of hits at once.
//
// A caller is named by its mTLS identity: the subject alternative names (URI, such as a SPIFFE
// id, DNS name, e-mail address, IP address) of the client certificate rls verified. The file:
//
//	callers:
//	  - identities: [spiffe://cluster.local/ns/mesh/sa/envoy]
//	    domains: [checkout, "team-*"]   # "*" is any domain; a trailing * is a prefix
//	    refund: true                    # may send is_negative_hits
//	    override: false                 # may not send a descriptor limit
//	    max_hits: 100                   # hits_addend above 100 is refused
//	default:                            # callers without a certificate, or not listed
//	  domains: [public]
//	  max_hits: 1
//
// An identity of the list is matched exactly; one ending in * matches every identity it is a
// prefix of. A certificate is matched by the entry naming one of its names exactly (the first
// in the file when several do), else by the longest pattern any of its names matches, else by
// the default entry. A caller matched by no entry, in a policy without a default entry, is
// refused every request: a policy names what is allowed, and what it does not name is not.
//
// refund and override are false unless set; max_hits, when absent, bounds nothing beyond rls's
// own bounds. domains must be given (an empty list refuses every domain), so that a forgotten
// line never means "any". Unknown keys, identities or patterns listed twice, anchors and merge
// keys are errors, reported as file:line.
package policy
