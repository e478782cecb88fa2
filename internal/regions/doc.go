// Package regions divides one limit among regions, each of which decides from its own store,
// so that what all regions admit together stays within the limit with no cross-region round
// trip on a decision.
//
// # Parties
//
//   - The Coordinator (one at a time, its State in the coordination store) splits each global
//     key's limit (r, b) into shares (rᵢ, bᵢ), max-min fair by the regions' demand.
//   - Each region's Agent (one at a time per region) reports the region's demand and
//     acknowledgements every Δ, takes the grants in the reply, and publishes the region's
//     table of shares in the region's store.
//   - Each replica fetches that table into a View and decides a global key under its share.
//
// # Why the shares never sum above the limit
//
// The coordinator counts, for each region, the largest share the region may be applying: the
// largest of the version it acknowledged and every version granted since. A cut is granted at
// once but frees nothing until acknowledged; growth is granted only within what the others
// are counted for. So Σ counted ≤ (r, b) at every instant, and it remains to show that no
// replica ever applies more than its region is counted for:
//
//   - A replica applies a table for at most TableLease after it began fetching it. An agent
//     acknowledges a version only TableLease plus the margin after its publication was
//     confirmed: by then every replica's fetch began after the publication, so none applies an
//     earlier version.
//   - A reply's lease runs from the sending of the report it answers, on the agent's clock;
//     the coordinator counts it from its receipt of that report, on the store's clock, plus a
//     margin. The sending comes first, so clock offsets do not matter; the margin covers the
//     clocks' drift (2ρL for drift ρ and lease L). A table ends at the agent's lease's end
//     less the margin, expressed on the region store's clock from a time read bracketed by the
//     agent's own clock, never later.
//   - Once a region's lease has ended (plus the margin), the coordinator counts its safe share
//     (zero, an equal split, or its last share; never more than it held) and cuts it to that;
//     every later reply carries the cut until acknowledged, so the region cannot apply more
//     again without applying the cut first. Its replicas fall to the same safe share at the
//     table's end, earlier.
//
// # Why the admitted total stays within b + r·T
//
// Write xᵢ for the tokens a region's GCRA state holds for a key (its burst less the requests
// it holds; negative when in debt). A region admits only while xᵢ covers the cost, and xᵢ
// grows at rᵢ up to bᵢ. If no share change ever raises xᵢ, then over any window [t, t+T] the
// region admits at most xᵢ(t) + ∫rᵢ ≤ bᵢ(t) + ∫rᵢ, and summed over regions at most b + r·T.
// So a share's change keeps the requests a region holds (a cut may leave it in debt, repaid at
// the new rate) and a burst that grows is charged its growth first (Change.Charge), so the
// tokens stay what they were: the region fills its larger burst at its rate, never at once.
package regions
