package descriptors

// The IANA time zone database, embedded (about 450 KB): timezone: names load the same in the
// scratch container image, which has no /usr/share/zoneinfo, as on a developer's machine, and
// rls validate accepts exactly what rls serve does.
import _ "time/tzdata"
