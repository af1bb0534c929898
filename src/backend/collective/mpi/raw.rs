//! The few raw MPI calls the engine makes through `mpi::ffi` (rsmpi's bindings): nonblocking
//! operations whose buffers must outlive an abandoned request, which rsmpi's scoped requests
//! cannot express. Every call's return code becomes a [`CollectiveError::Library`].

use std::os::raw::{c_char, c_int, c_void};

use mpi::ffi;

use crate::backend::collective::CollectiveError;

/// An MPI communicator handle. Sendable: the engine initializes MPI with
/// `MPI_THREAD_MULTIPLE`, and each communicator is used by one thread at a time (the data
/// communicator under the engine's lock, the heartbeat communicator by its thread).
#[derive(Clone, Copy)]
pub(crate) struct Comm(pub(crate) ffi::MPI_Comm);

// SAFETY: see the type's docs.
unsafe impl Send for Comm {}
// SAFETY: see the type's docs.
unsafe impl Sync for Comm {}

/// A pending nonblocking operation.
pub(crate) struct Request(ffi::MPI_Request);

// SAFETY: a request handle is a pointer to a library object; under MPI_THREAD_MULTIPLE it may
// be tested from any thread, and only its owner tests it.
unsafe impl Send for Request {}

/// `Ok` for `MPI_SUCCESS`, else the library's message.
pub(crate) fn check(rc: c_int, call: &str) -> Result<(), CollectiveError> {
    if rc == 0 {
        return Ok(());
    }
    Err(CollectiveError::Library {
        call: call.to_string(),
        code: rc,
        message: error_string(rc),
    })
}

fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; 1024];
    let mut len: c_int = 0;
    // SAFETY: MPI_MAX_ERROR_STRING is 256 in Open MPI and MPICH; the buffer holds 1024.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != 0 {
        return format!("MPI error code {code}");
    }
    c_text(&buf, len)
}

/// The first `len` C characters of `buf` as text.
fn c_text(buf: &[c_char], len: c_int) -> String {
    let bytes: Vec<u8> = buf[..(len.max(0) as usize).min(buf.len())]
        .iter()
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Comm {
    pub(crate) fn world() -> Comm {
        // SAFETY: reading a constant handle exported by the C shim.
        Comm(unsafe { ffi::RSMPI_COMM_WORLD })
    }

    /// A duplicate whose errors return codes instead of aborting the process.
    pub(crate) fn dup_returning_errors(self) -> Result<Comm, CollectiveError> {
        let mut out: ffi::MPI_Comm = self.0;
        // SAFETY: valid communicator; `out` receives the new handle.
        check(
            unsafe { ffi::MPI_Comm_dup(self.0, &mut out) },
            "MPI_Comm_dup",
        )?;
        // SAFETY: valid communicator and predefined error handler.
        check(
            unsafe { ffi::MPI_Comm_set_errhandler(out, ffi::RSMPI_ERRORS_RETURN) },
            "MPI_Comm_set_errhandler",
        )?;
        Ok(Comm(out))
    }

    pub(crate) fn free(mut self) -> Result<(), CollectiveError> {
        // SAFETY: a communicator this engine duplicated and no longer uses.
        check(unsafe { ffi::MPI_Comm_free(&mut self.0) }, "MPI_Comm_free")
    }

    pub(crate) fn rank_and_size(self) -> Result<(usize, usize), CollectiveError> {
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: valid communicator, out-pointers to locals.
        check(
            unsafe { ffi::MPI_Comm_rank(self.0, &mut rank) },
            "MPI_Comm_rank",
        )?;
        // SAFETY: as above.
        check(
            unsafe { ffi::MPI_Comm_size(self.0, &mut size) },
            "MPI_Comm_size",
        )?;
        Ok((rank as usize, size as usize))
    }

    /// This process's rank and the number of ranks among those sharing its memory (its host).
    pub(crate) fn local_rank_and_size(self) -> Result<(usize, usize), CollectiveError> {
        let mut local: ffi::MPI_Comm = self.0;
        // SAFETY: valid communicator; predefined split type and info constants.
        check(
            unsafe {
                ffi::MPI_Comm_split_type(
                    self.0,
                    ffi::RSMPI_COMM_TYPE_SHARED,
                    0,
                    ffi::RSMPI_INFO_NULL,
                    &mut local,
                )
            },
            "MPI_Comm_split_type",
        )?;
        let local = Comm(local);
        let out = local.rank_and_size();
        local.free()?;
        out
    }

    /// Every rank's `mine` (at most `width` bytes each), in rank order; blocking.
    pub(crate) fn all_gather_strings(
        self,
        mine: &str,
        size: usize,
        width: usize,
    ) -> Result<Vec<String>, CollectiveError> {
        let mut send = vec![0u8; width];
        let n = mine.len().min(width);
        send[..n].copy_from_slice(&mine.as_bytes()[..n]);
        let mut recv = vec![0u8; width * size];
        // SAFETY: `send` holds `width` bytes, `recv` `width·size`, as the counts say.
        check(
            unsafe {
                ffi::MPI_Allgather(
                    send.as_ptr().cast::<c_void>(),
                    width as c_int,
                    ffi::RSMPI_UINT8_T,
                    recv.as_mut_ptr().cast::<c_void>(),
                    width as c_int,
                    ffi::RSMPI_UINT8_T,
                    self.0,
                )
            },
            "MPI_Allgather",
        )?;
        Ok(recv
            .chunks(width)
            .map(|c| {
                let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
                String::from_utf8_lossy(&c[..end]).into_owned()
            })
            .collect())
    }
}

/// The host name MPI reports for this process.
pub(crate) fn processor_name() -> String {
    let mut buf = vec![0 as c_char; 1024];
    let mut len: c_int = 0;
    // SAFETY: MPI_MAX_PROCESSOR_NAME is 256 in Open MPI and MPICH; the buffer holds 1024.
    let rc = unsafe { ffi::MPI_Get_processor_name(buf.as_mut_ptr(), &mut len) };
    if rc != 0 {
        return "an unknown host".into();
    }
    c_text(&buf, len)
}

impl Request {
    /// Whether the operation completed (the request is then released by MPI).
    pub(crate) fn test(&mut self, call: &str) -> Result<bool, CollectiveError> {
        let mut flag: c_int = 0;
        // SAFETY: an active request owned by this value.
        check(
            unsafe { ffi::MPI_Test(&mut self.0, &mut flag, ffi::RSMPI_STATUS_IGNORE) },
            call,
        )?;
        Ok(flag != 0)
    }
}

/// The element types the engine sends.
#[derive(Clone, Copy)]
pub(crate) enum Elem {
    F32,
    U16,
    U8,
    U64,
}

impl Elem {
    fn datatype(self) -> ffi::MPI_Datatype {
        // SAFETY: reading constant handles exported by the C shim.
        unsafe {
            match self {
                Elem::F32 => ffi::RSMPI_FLOAT,
                Elem::U16 => ffi::RSMPI_UINT16_T,
                Elem::U8 => ffi::RSMPI_UINT8_T,
                Elem::U64 => ffi::RSMPI_UINT64_T,
            }
        }
    }
}

/// `MPI_Iallreduce(send → recv)` of `count` elements.
///
/// # Safety
/// `send` and `recv` must hold `count` elements of `elem` and stay valid (and `recv` unread
/// and unwritten) until the request completes — or forever if it never does.
pub(crate) unsafe fn iallreduce(
    comm: Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    elem: Elem,
    op: ffi::MPI_Op,
) -> Result<Request, CollectiveError> {
    // SAFETY: a null handle, overwritten by MPI.
    let mut req = Request(unsafe { ffi::RSMPI_REQUEST_NULL });
    // SAFETY: the caller's contract.
    let rc = unsafe {
        ffi::MPI_Iallreduce(
            send,
            recv,
            count as c_int,
            elem.datatype(),
            op,
            comm.0,
            &mut req.0,
        )
    };
    check(rc, "MPI_Iallreduce")?;
    Ok(req)
}

/// `MPI_Ibcast` of `count` elements from `root`.
///
/// # Safety
/// As [`iallreduce`] for `buf`.
pub(crate) unsafe fn ibcast(
    comm: Comm,
    buf: *mut c_void,
    count: usize,
    elem: Elem,
    root: usize,
) -> Result<Request, CollectiveError> {
    // SAFETY: a null handle, overwritten by MPI.
    let mut req = Request(unsafe { ffi::RSMPI_REQUEST_NULL });
    // SAFETY: the caller's contract.
    let rc = unsafe {
        ffi::MPI_Ibcast(
            buf,
            count as c_int,
            elem.datatype(),
            root as c_int,
            comm.0,
            &mut req.0,
        )
    };
    check(rc, "MPI_Ibcast")?;
    Ok(req)
}

/// `MPI_Isend` / `MPI_Irecv` of `count` u64 values with `tag`.
///
/// # Safety
/// As [`iallreduce`] for `buf`.
pub(crate) unsafe fn ipoint(
    comm: Comm,
    buf: *mut u64,
    count: usize,
    peer: usize,
    tag: i32,
    send: bool,
) -> Result<Request, CollectiveError> {
    // SAFETY: a null handle, overwritten by MPI.
    let mut req = Request(unsafe { ffi::RSMPI_REQUEST_NULL });
    let dt = Elem::U64.datatype();
    // SAFETY: the caller's contract.
    let rc = unsafe {
        if send {
            ffi::MPI_Isend(
                buf.cast::<c_void>(),
                count as c_int,
                dt,
                peer as c_int,
                tag,
                comm.0,
                &mut req.0,
            )
        } else {
            ffi::MPI_Irecv(
                buf.cast::<c_void>(),
                count as c_int,
                dt,
                peer as c_int,
                tag,
                comm.0,
                &mut req.0,
            )
        }
    };
    check(rc, if send { "MPI_Isend" } else { "MPI_Irecv" })?;
    Ok(req)
}

/// The predefined sum, max and min reductions.
pub(crate) fn predefined_op(op: crate::ir::ReduceOp) -> ffi::MPI_Op {
    use crate::ir::ReduceOp;
    // SAFETY: reading constant handles exported by the C shim.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
        }
    }
}

/// A user-defined commutative reduction (freed on drop).
pub(crate) struct UserOp(pub(crate) ffi::MPI_Op);

// SAFETY: an op handle is immutable after creation; MPI_THREAD_MULTIPLE.
unsafe impl Send for UserOp {}
// SAFETY: as above.
unsafe impl Sync for UserOp {}

impl UserOp {
    pub(crate) fn commutative(f: ffi::MPI_User_function) -> Result<UserOp, CollectiveError> {
        // SAFETY: a null handle, overwritten by MPI.
        let mut op = unsafe { ffi::RSMPI_SUM };
        // SAFETY: `f` is a valid `extern "C"` reduction function.
        check(
            unsafe { ffi::MPI_Op_create(f, 1, &mut op) },
            "MPI_Op_create",
        )?;
        Ok(UserOp(op))
    }

    pub(crate) fn free(mut self) {
        // SAFETY: a user op created by `commutative`, no longer used by pending operations.
        unsafe { ffi::MPI_Op_free(&mut self.0) };
    }
}

/// The bf16 sum of the engine's compressed all-reduces, as an MPI user function.
///
/// # Safety
/// Called by MPI with `len` u16 elements at both pointers.
pub(crate) unsafe extern "C" fn bf16_sum(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    // SAFETY: MPI passes `*len` elements of the u16 type the engine reduces with this op.
    unsafe {
        let n = (*len).max(0) as usize;
        let x = std::slice::from_raw_parts(invec.cast::<u16>(), n);
        let acc = std::slice::from_raw_parts_mut(inoutvec.cast::<u16>(), n);
        crate::backend::collective::wire::add_bf16_bits(acc, x);
    }
}
